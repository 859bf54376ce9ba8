"""The shared tests, listed once: what every capability a gateway serves must pass.

Each takes the ``capability`` under test (parametrized by ``tests/conftest.py``: the built-in
ones, or a module's ``EXTRA_CAPABILITIES``) or all of them (``capabilities_under_test``), and reads
everything else from its descriptor. A test module that serves capabilities of its own runs them
on those with ``from tests.capability_checks import *`` (``tests/test_capability_model.py``).
"""

from tests.test_capabilities import (
    test_bodies_over_the_limit_are_refused_from_the_headers,
    test_delete_namespace_deletes_its_data_and_nothing_else,
    test_every_write_is_a_declared_change,
    test_metrics_count_each_route_by_template,
    test_openapi_documents_each_operation,
    test_table_data_exports_and_imports_to_the_same_answers,
)
from tests.test_isolation import test_isolation_matrix, test_same_names_in_two_namespaces_never_meet
from tests.test_schemathesis import test_every_operation_answers_as_documented
from tests.test_scoping import test_every_statement_on_a_namespaced_table_is_scoped

__all__ = [
    "test_bodies_over_the_limit_are_refused_from_the_headers",
    "test_delete_namespace_deletes_its_data_and_nothing_else",
    "test_every_operation_answers_as_documented",
    "test_every_statement_on_a_namespaced_table_is_scoped",
    "test_every_write_is_a_declared_change",
    "test_isolation_matrix",
    "test_metrics_count_each_route_by_template",
    "test_openapi_documents_each_operation",
    "test_same_names_in_two_namespaces_never_meet",
    "test_table_data_exports_and_imports_to_the_same_answers",
]
