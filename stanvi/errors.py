"""The exception types stanvi raises: one per kind of failure (docs/architecture.md#conventions).

Every exception carries a message meant for a person: what went wrong, where, and (for Stan)
the compiler's or the model's own words.
"""

from __future__ import annotations


class StanviError(Exception):
    """Base class of every error stanvi raises on purpose."""


class CacheDirError(StanviError, PermissionError):
    """The stanvi cache directory cannot be created or written (an OSError too, so code that
    treats the cache as optional keeps working)."""


class ToolchainError(StanviError):
    """The Stan toolchain (stanc, headers, a C++ compiler) is missing or broken."""


class StanCompileError(StanviError):
    """A `.stan` file did not compile.

    Attributes:
        path: the `.stan` file (or None for code given as a string).
        line, column: where stanc located the problem, when it said so.
        stanc_message: stanc's own message, unchanged.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 column: int | None = None, stanc_message: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.column = column
        self.stanc_message = stanc_message


class StanDataError(StanviError):
    """The data do not fit the model: a variable is missing, mis-shaped, of the wrong type,
    or violates its declared constraint.

    Attributes:
        variable: the Stan data variable named by Stan's message, when it names one.
    """

    def __init__(self, message: str, *, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


class ModelEvaluationError(StanviError):
    """The model threw while evaluating its log density (or gradient, HVP, constrain) at a point:
    a domain error, a `reject()` statement, an out-of-support value."""


class VIError(StanviError):
    """A variational method cannot proceed (zero-parameter model, every draw failed, ...)."""


class NotConvergedError(VIError):
    """``stanvi.fit(..., require_converged=True)`` and the method stopped for another reason than
    its convergence rule ('max_iters', 'budget' or 'failed').

    Attributes:
        fit: the :class:`stanvi.Fit` as it stood (its ``status`` and ``message`` say why).
    """

    def __init__(self, message: str, *, fit=None) -> None:
        super().__init__(message)
        self.fit = fit


class DivergedError(VIError):
    """The method ended with non-finite variational parameters (its steps diverged), so there is
    no approximation to draw from: ``stanvi.fit`` raises this instead of returning a fit.

    The run itself ended ``failed`` (a property of the model and method, like a fit that stops
    short), not with a broken call: ``stanvi batch`` records it with status ``failed``.

    Attributes:
        method: the method that diverged.
        status: the status the method reported (normally ``'failed'``).
        method_message: the method's own message (why its steps diverged).
    """

    def __init__(self, method: str, status: str, method_message: str) -> None:
        super().__init__(f"{method} returned non-finite parameters ({status}: {method_message})")
        self.method = method
        self.status = status
        self.method_message = method_message


class OutputError(StanviError):
    """Some of a fit's output files could not be written; the others were.

    Attributes:
        saved: kind -> path of the files written.
        failed: kind -> the reason each other file was not written.
    """

    def __init__(self, message: str, *, saved: dict, failed: dict) -> None:
        super().__init__(message)
        self.saved = dict(saved)
        self.failed = dict(failed)


class MissingExtraError(StanviError, ImportError):
    """A part of stanvi that needs an optional dependency was used without it: the message names
    the extra that installs it (``pip install 'stanvi[batch]'``, docs/quickstart.md#extras)."""


def require_extra(module: str, extra: str, purpose: str) -> None:
    """Raise :class:`MissingExtraError` unless ``module`` can be imported; ``purpose`` says what
    needs it ("stanvi batch runs its tasks on Dask")."""
    import importlib.util  # noqa: PLC0415

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a parent package missing, or a module set to None
        found = False
    if not found:
        raise MissingExtraError(f"{purpose}, and the {module!r} package is not installed: "
                                f"pip install 'stanvi[{extra}]' (or pip install {module})")


class StanviWarning(UserWarning):
    """Base class of the warnings stanvi issues (filter them with
    ``warnings.filterwarnings("ignore", category=stanvi.StanviWarning)``)."""


class NotConvergedWarning(StanviWarning):
    """A fit stopped on its iteration limit, its oracle budget, or a failure, not on its
    convergence rule: the approximation may be far from the optimum."""
