"""Databases: engines, tables, statements, transactions, scoping, migrations."""
