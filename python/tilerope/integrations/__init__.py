"""tilerope in other frameworks' own extension points (transformers: :mod:`.transformers`)."""
