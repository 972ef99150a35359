#!/usr/bin/env python
"""Django's command-line utility for AutoMechanica."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "automechanica.settings")
    from django.core.management import execute_from_command_line

    from automechanica.deployment import SettingsRefused

    try:
        execute_from_command_line(sys.argv)
    except SettingsRefused as refused:
        sys.exit(f"manage.py: {refused}")


if __name__ == "__main__":
    main()
