"""A minimal Django project for tests/test_django.py, run as ``python -m tests.django_project``
(its ``manage.py``). The database is ``NOVAQUE_DJANGO_URL``, a SQLAlchemy URL of
the test backend."""
