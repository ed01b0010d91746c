"""What ``defaults.set`` and ``cufile_driver.set`` share: KvikIO's ``set(name, value)`` /
``set({name: value})`` call shape, and a context manager that puts the old values back."""

from __future__ import annotations

from typing import Any, Callable


def config_of(args: tuple[Any, ...], where: str) -> dict[str, Any]:
    """The ``{name: value}`` a ``set(*args)`` call asks for; ``ValueError`` naming both valid
    call shapes of ``where`` (``gpumapio.defaults.set``, say) for any other."""
    if len(args) == 1 and isinstance(args[0], dict):
        return args[0]
    if len(args) == 2 and isinstance(args[0], str):
        return {args[0]: args[1]}
    raise ValueError(
        f"Valid arguments are {where}(config: dict) or {where}(key: str, value: Any)"
    )


class Restoring:
    """Sets ``config`` through ``write`` now, keeping what ``read`` gave before; that comes
    back through ``put_back`` (``write`` unless given), last set first, at the end of a
    ``with`` block — or at once when a later value of ``config`` is refused, so that a failed
    call changes nothing. ``read`` may save more than the value (where it came from) for
    ``put_back`` to restore."""

    __slots__ = ("_old", "_put_back")

    def __init__(
        self,
        config: dict[str, Any],
        read: Callable[[str], Any],
        write: Callable[[str, Any], None],
        put_back: Callable[[str, Any], None] | None = None,
    ) -> None:
        self._put_back = put_back or write
        self._old: dict[str, Any] = {}
        try:
            for name, value in config.items():
                old = read(name)
                write(name, value)
                self._old[name] = old
        except BaseException:
            self._restore()
            raise

    def _restore(self) -> None:
        for name, value in reversed(list(self._old.items())):
            self._put_back(name, value)

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._restore()
