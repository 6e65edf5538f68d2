"""One runner per task kind (embedding, completion, sleep), behind the `Runner` protocol in base.py;
registry.py builds the ones an agent serves."""
