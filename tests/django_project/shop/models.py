from __future__ import annotations

from django.db import models


class Order(models.Model):
    number = models.IntegerField(unique=True)


class Mail(models.Model):
    """Written by the mailer handler, one per order message it handled."""

    order_number = models.IntegerField()
    message_id = models.BigIntegerField()
