"""Handlers of the test project's consumers (``settings.NOVAQUE["CONSUMERS"]``)."""

from __future__ import annotations

import json

import novaque
from tests.django_project.shop.models import Mail


def send_mail(msg: novaque.Message) -> None:
    """Record the mail of an order through the ORM (the worker's own Django connection)."""
    order = json.loads(msg.body)["order"]
    Mail.objects.create(order_number=order, message_id=msg.id)


def audit(msg: novaque.Message) -> None:
    """Nothing to do: the second consumer shows that every configured one runs."""
