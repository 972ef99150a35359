"""``relay_events``: the event stream onto a broker (NATS JetStream or RabbitMQ), and
``cmd.task.execute.v1`` commands from it into tasks.

- ``loop``: reads the stream from the destination's cursor, publishes with confirms,
  advances the cursor, reconnects after an outage;
- ``jetstream`` and ``rabbitmq``: one bridge per broker (their clients are extras);
- ``commands``: a command envelope into a task, idempotently.
"""
