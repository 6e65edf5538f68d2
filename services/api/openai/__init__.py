"""OpenAI's Files, Batches, Embeddings and Chat Completions API under /v1: an adapter at the
edge that turns a batch into a Minions task and a task's results into OpenAI's output and error
files. docs/OPENAI.md lists what is supported and every deliberate difference."""
