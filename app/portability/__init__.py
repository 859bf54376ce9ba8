"""Namespace export and import (issue #47): the archive format, its writer and reader, HTTP and CLI."""
