"""Object storage: S3 or a local folder behind one interface (`ObjectStore`); see base.py."""

from minions.store.base import InvalidKey, ObjectNotFound, ObjectStore, StoreError
from minions.store.factory import open_store

__all__ = ["InvalidKey", "ObjectNotFound", "ObjectStore", "StoreError", "open_store"]
