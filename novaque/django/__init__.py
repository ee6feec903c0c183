"""novaque in a Django project: publish inside ``transaction.atomic()``.

Add ``"novaque.django"`` to ``INSTALLED_APPS``, then::

    from django.db import transaction
    import novaque.django

    with transaction.atomic():
        order = Order.objects.create(number=42)
        novaque.django.publish("orders", f'{{"order": {order.pk}}}')

:func:`publish` writes the message and its deliveries on Django's own
database connection, in the transaction of the ``atomic()`` block: a
rollback leaves nothing behind, and once Django commits, the message is
there with the rows written beside it (it is not an ``on_commit`` hook, so a
crash between the commit and a hook cannot lose it). Outside any
``atomic()`` block it opens one of its own, so a message is never half
written. PostgreSQL (psycopg 3), MySQL/MariaDB (mysqlclient or PyMySQL's
``install_as_MySQLdb()``) and SQLite are supported.

:func:`client` is the :class:`novaque.Client` of a database alias (one per
alias and process) for everything else: consuming, topology, stats. The
``novaque`` management command migrates (``manage.py novaque migrate``) and
runs the consumers of ``NOVAQUE["CONSUMERS"]`` (``manage.py novaque run``).

Settings: an optional ``NOVAQUE`` dict with the keys

- ``"OPTIONS"``: :class:`novaque.Options` fields for every client
  (``{"default_max_attempts": 8, "max_in_flight": 4}``);
- ``"CONSUMERS"``: ``{"topic/channel": handler}`` for ``manage.py novaque
  run``, a handler being the dotted path of a function (``"shop.handlers.send_mail"``)
  or a dict ``{"handler": path, ...}`` whose other keys are
  :meth:`novaque.Client.subscribe` options (``max_in_flight``, ``lease``,
  ``backoff``, ``poll_interval``);
- ``"SHUTDOWN_TIMEOUT"``: seconds ``manage.py novaque run`` waits for
  running handlers on SIGINT/SIGTERM (default 10).

How the connection is shared: novaque's statements run on a SQLAlchemy
connection whose DBAPI connection is Django's (``connection.connection``)
through a thin wrapper that passes statements through and ignores
SQLAlchemy's ``rollback()`` and ``close()``. SQLAlchemy sends nothing else
on a connection it did not open: no ``BEGIN`` (the drivers begin
implicitly; Django's ``atomic()`` began already), no isolation or
autocommit change (the wrapper refuses attribute writes) and no
``COMMIT`` (the wrapper raises if one were ever asked for). Django alone
ends the transaction.
"""

from __future__ import annotations

try:
    import django as _django  # noqa: F401  (the error below if it is missing)
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    if exc.name != "django":
        raise
    raise ImportError(
        "novaque.django needs Django: install it with pip install 'novaque[django]'"
    ) from exc

from novaque.django._connect import client, database_url, publish, publish_many

__all__ = ["client", "database_url", "publish", "publish_many"]
