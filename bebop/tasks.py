"""`bebop.tasks.get(name)` and the task types, where they lived before bebop.data.tasks (a public name)."""

from bebop.data.tasks import *  # noqa: F401,F403
from bebop.data.tasks import __all__  # noqa: F401
