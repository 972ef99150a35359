"""The agents' raw SQL: agent memory (``memory``), direct messages (``messages``) and
publish/subscribe (``pubsub``), as named, parameterised statements run through
``task_queue.sql.db``."""
