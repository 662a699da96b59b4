"""The local stack: template.yaml on this machine behind one interface (:class:`base.Stack`), run by
:mod:`tools.stack.inprocess` (the handlers in this process on moto server) or :mod:`tools.stack.deployed` (sam build
+ sam deploy into ministack)."""

from tools.stack.base import SetupError as SetupError
from tools.stack.base import Stack as Stack
