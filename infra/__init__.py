"""Grafana provisioning, the HAProxy config and the agent's launchd/systemd templates: package data of
`minions.infra` (package-dir maps this folder), read through importlib.resources. This file makes the
folder a regular package: an editable install's import hook finds a mapped folder only by its
__init__.py."""
