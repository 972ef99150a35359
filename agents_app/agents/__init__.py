"""The AutoMechanica agents. Each module registers its agent on import."""
