"""The schema, its migrations and the named queries: package data of `minions.sql` (package-dir maps
this folder), read through importlib.resources (minions.db.paths). This file makes the folder a
regular package: an editable install's import hook finds a mapped folder only by its __init__.py."""
