"""Settings of the test project: one database, from the SQLAlchemy URL in
``NOVAQUE_DJANGO_URL`` (SQLite file, PostgreSQL or MariaDB/MySQL)."""

from __future__ import annotations

import os
from typing import Any

import django
import sqlalchemy as sa

SECRET_KEY = "novaque-tests"
USE_TZ = True
INSTALLED_APPS = ["novaque.django", "tests.django_project.shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None


def _database(url: sa.URL) -> dict[str, Any]:
    backend = url.get_backend_name()
    if backend == "sqlite":
        options: dict[str, Any] = {"timeout": 30}
        if django.VERSION >= (5, 1):
            # Take the write lock at BEGIN, where the timeout applies
            # (docs/how-to/django.md says why).
            options["transaction_mode"] = "IMMEDIATE"
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": url.database, "OPTIONS": options}
    if backend == "postgresql":
        engine = "django.db.backends.postgresql"
    else:
        import pymysql

        pymysql.install_as_MySQLdb()  # Django's MySQL backend on PyMySQL
        engine = "django.db.backends.mysql"
    return {
        "ENGINE": engine,
        "NAME": url.database,
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
    }


DATABASES = {
    "default": _database(sa.make_url(os.environ["NOVAQUE_DJANGO_URL"])),
    # Never connected to: for the error of an engine novaque does not support.
    "legacy": {"ENGINE": "django.db.backends.oracle", "NAME": "legacy"},
}

NOVAQUE = {
    "OPTIONS": {"poll_interval": 0.05, "stats_flush_interval": 0.2},
    "CONSUMERS": {
        "orders/mailer": "tests.django_project.shop.handlers.send_mail",
        "orders/audit": {"handler": "tests.django_project.shop.handlers.audit", "max_in_flight": 2},
    },
    "SHUTDOWN_TIMEOUT": 10,
}
if os.environ.get("NOVAQUE_DJANGO_TYPO"):
    NOVAQUE["CONSUMER"] = {}  # for the error of a misspelt key
