# One image for every process (docker-compose.yml picks each one's command). The
# dependencies are exactly uv.lock's (`--locked` fails if pyproject.toml and the lock
# disagree), with the relay's broker clients and without the dev group.
FROM python:3.12-slim
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PROJECT_ENVIRONMENT=/app/.venv
WORKDIR /app
COPY pyproject.toml uv.lock ./
RUN uv sync --locked --no-dev --extra nats --extra amqp
COPY . .
# Not root; var/ holds the payload blobs (a volume shared by every app service).
RUN useradd --system --uid 10001 automechanica \
    && mkdir -p /app/var/blobs && chown -R automechanica /app/var
# By number (hadolint DL3066): a runtime that cannot read /etc/passwd knows it is not root.
USER 10001
ENV PATH="/app/.venv/bin:$PATH" PYTHONUNBUFFERED=1
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "-v", "0", "automechanica.asgi:application"]
