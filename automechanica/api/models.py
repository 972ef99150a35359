"""API tokens: who may call the HTTP API, and how much they may do."""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now


class Scope(models.TextChoices):
    """Each scope includes the ones before it: ``admin`` may do what ``write`` may."""

    READ = "read"  # look at tasks, workflows, agents, workers, metrics
    WRITE = "write"  # create, edit, cancel and revive tasks and workflows
    ADMIN = "admin"  # bulk revive by filter, set agents' limits


SCOPE_ORDER = [Scope.READ, Scope.WRITE, Scope.ADMIN]


def scope_allows(granted: str, required: str) -> bool:
    return SCOPE_ORDER.index(Scope(granted)) >= SCOPE_ORDER.index(Scope(required))


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 is stored: the token is shown once, at creation.

    A plain hash (not a password hash) is enough because tokens are 256 random bits,
    not guessable words, and it lets a request find its token by an index lookup.
    """

    name = models.TextField()
    scope = models.TextField(choices=Scope.choices)
    # The token's first characters, to tell tokens apart in the admin and in logs.
    prefix = models.TextField()
    token_hash = models.TextField(unique=True)
    created_at = models.DateTimeField(db_default=Now())
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # The agents this token may act as in agent messaging (send, read a mailbox or a
    # subscription, acknowledge, revive); empty: any agent (automechanica.api.agents).
    agents = ArrayField(models.TextField(), default=list, blank=True)

    class Meta:
        db_table = "api_tokens"
        ordering = ["name", "created_at"]
        verbose_name = "API token"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(scope__in=Scope.values), name="api_tokens_scope_valid"
            )
        ]

    def __str__(self) -> str:
        bound = f", as {', '.join(self.agents)}" if self.agents else ""
        return f"{self.name} ({self.scope}{bound}, {self.prefix}…)"

    @property
    def actor(self) -> str:
        """How task history names this token's actions."""
        return f"token:{self.name}"
