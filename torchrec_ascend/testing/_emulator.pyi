# Type stub of a compiled library of this package (built by setup.py): its functions are typed where they are
# wrapped (the .py modules beside it), so here every name is Any.
from typing import Any

def __getattr__(name: str) -> Any: ...
