"""Unit tier settings. Hypothesis's per-example deadline is a timing assertion (a cold import or
a busy CI core fails it at random), so it is off: a property test here checks results, not speed."""
from hypothesis import settings

settings.register_profile("unit", deadline=None)
settings.load_profile("unit")
