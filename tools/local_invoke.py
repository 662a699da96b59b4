"""A Docker-free stand-in for ``sam local invoke``.

Usage::

    python -m tools.local_invoke PollFunction -e events/poll.json \\
        [--env-vars env.json] [--parameter-overrides K=V ...] [--template template.yaml]

The function is resolved from the template as the in-process stack resolves it
(:func:`tools.template.resolve`: the SAM transform, then CreateStack in moto's in-memory mock; a
Ref to a resource gives the name moto made for it) and its handler runs in a fresh Python process (like sam's fresh
container) with the current interpreter: ``sys.path`` starts with the function's code dir and its
layers' dirs, the environment is the parent's plus the function's variables (which win) plus the
variables Lambda sets, and the context counts down from the function's Timeout. The handler's
JSON result goes to stdout, everything it logs or prints goes to stderr. A handler that raises
exits 1 (traceback on stderr, Lambda's error JSON on stdout); one that runs past its Timeout is
killed and exits 124 with "Function timed out after N s".

This module imports only the standard library at import time: the child process loads it by
file path to run the handler, without putting the repository on the handler's ``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import decimal
import fcntl
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from tools.template import Function as FunctionSpec

__all__ = [
    "TIMEOUT_EXIT_CODE",
    "InvokeResult",
    "LambdaContext",
    "apply_env_vars",
    "invoke_subprocess",
    "main",
    "make_context",
    "prepare_environment",
]

ACCOUNT_ID = "123456789012"
DEFAULT_REGION = "us-east-1"
#: Exit code of an invocation that ran past the function's Timeout (as timeout(1) uses).
TIMEOUT_EXIT_CODE = 124
#: Time allowed for interpreter start-up and the handler module's import (Lambda's init limit).
INIT_TIMEOUT_S = 10.0


# ---------------------------------------------------------------------------------------------
# Context
# ---------------------------------------------------------------------------------------------


def _log_stream_name() -> str:
    return f"{_dt.datetime.now(_dt.UTC):%Y/%m/%d}/[$LATEST]{uuid.uuid4().hex}"


class LambdaContext:
    """The ``context`` argument of a Python Lambda handler (what Powertools reads from it)."""

    def __init__(
        self,
        function_name: str,
        memory_limit_in_mb: int,
        timeout_s: float,
        aws_request_id: str | None = None,
        region: str = DEFAULT_REGION,
        account_id: str = ACCOUNT_ID,
        function_version: str = "$LATEST",
        log_stream_name: str | None = None,
    ) -> None:
        self.function_name = function_name
        self.function_version = function_version
        self.invoked_function_arn = f"arn:aws:lambda:{region}:{account_id}:function:{function_name}"
        self.memory_limit_in_mb = int(memory_limit_in_mb)
        self.aws_request_id = aws_request_id or str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = log_stream_name or _log_stream_name()
        self.identity: Any = None
        self.client_context: Any = None
        self.tenant_id: str | None = None
        self._deadline = time.monotonic() + float(timeout_s)

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before the function's Timeout (never negative)."""
        return max(0, int((self._deadline - time.monotonic()) * 1000))

    def __repr__(self) -> str:
        return (
            f"LambdaContext(function_name={self.function_name!r}, aws_request_id={self.aws_request_id!r}, "
            f"remaining_ms={self.get_remaining_time_in_millis()})"
        )


def _region(env: Mapping[str, str]) -> str:
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def make_context(spec: FunctionSpec, request_id: str | None = None) -> LambdaContext:
    """A fresh context for an in-process call of ``spec``'s handler (deadline = now + Timeout)."""
    return LambdaContext(
        function_name=spec.function_name,
        memory_limit_in_mb=spec.memory,
        timeout_s=spec.timeout,
        aws_request_id=request_id,
        region=_region(os.environ),
    )


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------


def prepare_environment(spec: FunctionSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the handler process gets.

    ``base`` (default: this process's environment, for PATH, AWS credentials, AWS_ENDPOINT_URL...)
    plus the variables Lambda sets, then the function's own variables, which take precedence.
    AWS_REGION/AWS_DEFAULT_REGION default to each other, else us-east-1.
    """
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "AWS_LAMBDA_FUNCTION_NAME": spec.function_name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory),
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_TIMEOUT": str(spec.timeout),
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.function_name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": _log_stream_name(),
            "AWS_EXECUTION_ENV": f"AWS_Lambda_{spec.runtime}",
            "AWS_SAM_LOCAL": "true",
            "LAMBDA_TASK_ROOT": str(spec.code_dir),
            "_HANDLER": spec.handler,
            "TZ": ":UTC",
        }
    )
    env.update(spec.environment)
    region = _region(env)
    env.setdefault("AWS_REGION", region)
    env.setdefault("AWS_DEFAULT_REGION", region)
    return env


def _env_value(value: Any) -> str:
    """Stringify an env-vars file value like SAM does."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value)


def apply_env_vars(
    spec: FunctionSpec, env_vars: Mapping[str, Any], warn: IO[str] | None = None
) -> FunctionSpec:
    """Apply a SAM ``--env-vars`` document to ``spec``.

    ``Parameters`` applies to every function, the entry keyed by the function's logical id (or
    its FunctionName) to this one and wins. Like SAM, only variables the template declares for the
    function are overridden; the others are ignored (with a warning on ``warn``).
    """
    overrides: dict[str, Any] = dict(env_vars.get("Parameters") or {})
    specific = env_vars.get(spec.logical_id)
    if specific is None and spec.function_name != spec.logical_id:
        specific = env_vars.get(spec.function_name)
    overrides.update(specific or {})
    environment = dict(spec.environment)
    ignored = []
    for name, value in overrides.items():
        if name in environment:
            environment[name] = _env_value(value)
        else:
            ignored.append(name)
    if ignored and warn is not None:
        print(
            f"local_invoke: env-vars not declared in {spec.logical_id}'s Environment are ignored "
            f"(as sam does): {', '.join(sorted(ignored))}",
            file=warn,
        )
    return dataclasses.replace(spec, environment=environment)


# ---------------------------------------------------------------------------------------------
# Running the handler in a fresh process
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class InvokeResult:
    """Outcome of one invocation: the child's exit code, parsed stdout, raw stdout and stderr."""

    returncode: int
    payload: Any
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


_BOOTSTRAP = """\
import importlib.util, sys
_spec = importlib.util.spec_from_file_location("_local_invoke_runtime", {path!r})
_module = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _module
_spec.loader.exec_module(_module)
_module._child_main()
"""


def _python_paths(spec: FunctionSpec) -> list[str]:
    """Code dir, then each layer's dir (its ``python/`` subdir when built by ``sam build``)."""
    paths = [str(spec.code_dir)]
    for layer in spec.layer_dirs:
        built = Path(layer) / "python"
        paths.append(str(built if built.is_dir() else layer))
    return paths


def _timeout_message(seconds: float) -> str:
    return f"Function timed out after {seconds:g} s"


def _reader(stream: IO[bytes], sink: list[bytes], tee: IO[str] | None) -> None:
    for chunk in iter(lambda: stream.readline(), b""):
        sink.append(chunk)
        if tee is not None:
            tee.write(chunk.decode(errors="replace"))
            tee.flush()
    stream.close()


def invoke_subprocess(
    spec: FunctionSpec,
    event: Any,
    extra_env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    stream_stderr: IO[str] | None = None,
) -> InvokeResult:
    """Run ``spec``'s handler once on ``event`` in a fresh interpreter.

    ``extra_env`` is applied last (over the function's variables); ``timeout`` replaces the
    function's Timeout. ``stream_stderr`` receives the child's logs live (they are captured in
    the result either way). The payload is the handler's parsed JSON result, Lambda's error
    document (``errorType``/``errorMessage``) on failure, or None if stdout was not JSON.
    """
    timeout_s = float(spec.timeout if timeout is None else timeout)
    env = prepare_environment(spec)
    env.update(extra_env or {})
    config = {
        "handler": spec.handler,
        "paths": _python_paths(spec),
        "timeout": timeout_s,
        "function_name": spec.function_name,
        "memory": spec.memory,
        "request_id": str(uuid.uuid4()),
        "region": _region(env),
        "account_id": ACCOUNT_ID,
        "event": event,
    }
    command = [sys.executable, "-c", _BOOTSTRAP.format(path=str(Path(__file__).resolve()))]
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=spec.code_dir,
        start_new_session=True,  # its own process group: a timeout kills what the handler spawned
    )
    out: list[bytes] = []
    err: list[bytes] = []
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    readers = [
        threading.Thread(target=_reader, args=(process.stdout, out, None), daemon=True),
        threading.Thread(target=_reader, args=(process.stderr, err, stream_stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        try:
            process.stdin.write(json.dumps(config).encode())
            process.stdin.close()
        except BrokenPipeError:
            pass  # the child died at start-up: its stderr says why
        try:
            returncode = process.wait(timeout=timeout_s + INIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # The child's own watchdog did not fire (e.g. the handler holds the GIL): kill it.
            timed_out = True
            _kill_group(process)
            returncode = process.wait()
    except BaseException:
        _kill_group(process)
        process.wait()
        raise
    for reader in readers:
        reader.join(timeout=5)
    stdout = b"".join(out).decode(errors="replace")
    stderr = b"".join(err).decode(errors="replace")
    if timed_out:
        message = _timeout_message(timeout_s)
        stderr += f"{message}\n"
        if stream_stderr is not None:
            print(message, file=stream_stderr, flush=True)
        payload: Any = {"errorType": "Sandbox.Timedout", "errorMessage": message}
        stdout = json.dumps(payload)
        return InvokeResult(TIMEOUT_EXIT_CODE, payload, stdout, stderr)
    try:
        payload = json.loads(stdout) if stdout.strip() else None
    except ValueError:
        payload = None
    return InvokeResult(returncode, payload, stdout, stderr)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (its pgid is its own pid: it leads a new session)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


# -- the child side -----------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _error_document(error: BaseException, error_type: str | None = None) -> dict[str, Any]:
    return {
        "errorMessage": str(error),
        "errorType": error_type or type(error).__name__,
        "stackTrace": traceback.format_tb(error.__traceback__),
    }


def _child_main() -> None:  # pragma: no cover - runs in the child process
    """Run one invocation; ``config`` arrives on stdin, the result leaves on the original stdout."""
    config = json.load(sys.stdin)
    # Keep the real stdout for the result only; the handler's prints and logs go to stderr.
    result_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    sys.path[:0] = config["paths"]

    lock = threading.Lock()
    finished = False

    def finish(code: int, document: Any = None, text: str | None = None) -> NoReturn:
        if text is None:
            text = json.dumps(document)
        data = (text + "\n").encode()
        while data:
            data = data[os.write(result_fd, data) :]
        sys.stderr.flush()
        os._exit(code)

    module_name, _, function_name = config["handler"].rpartition(".")
    try:
        module = importlib.import_module(module_name.replace("/", "."))
        handler = getattr(module, function_name)
    except Exception as error:
        traceback.print_exc()
        finish(1, _error_document(error, "Runtime.ImportModuleError"))

    timeout_s = float(config["timeout"])
    context = LambdaContext(
        function_name=config["function_name"],
        memory_limit_in_mb=config["memory"],
        timeout_s=timeout_s,
        aws_request_id=config["request_id"],
        region=config["region"],
        account_id=config["account_id"],
        log_stream_name=os.environ.get("AWS_LAMBDA_LOG_STREAM_NAME"),
    )

    def on_timeout() -> None:
        with lock:
            if finished:
                return
            message = _timeout_message(timeout_s)
            print(f"{config['request_id']} {message}", file=sys.stderr)
            finish(TIMEOUT_EXIT_CODE, {"errorType": "Sandbox.Timedout", "errorMessage": message})

    watchdog = threading.Timer(context.get_remaining_time_in_millis() / 1000, on_timeout)
    watchdog.daemon = True
    watchdog.start()
    try:
        result = handler(config["event"], context)
    except BaseException as error:  # Lambda reports SystemExit & co. too
        with lock:
            finished = True
            watchdog.cancel()
        # Drop this bootstrap's own frame: show the handler's frames only, as Lambda does.
        error.__traceback__ = error.__traceback__.tb_next if error.__traceback__ else None
        traceback.print_exception(error)
        finish(1, _error_document(error))
    with lock:
        finished = True
        watchdog.cancel()
    try:
        text = json.dumps(result, default=_json_default)
    except (TypeError, ValueError) as error:
        traceback.print_exc()
        finish(1, _error_document(error, "Runtime.MarshalError"))
    finish(0, text=text)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def parse_parameter_overrides(items: Sequence[str]) -> dict[str, str]:
    """SAM's ``--parameter-overrides``: ``K=V`` or ``ParameterKey=K,ParameterValue=V`` items."""
    result: dict[str, str] = {}
    for item in items:
        for token in shlex.split(item):
            if token.startswith("ParameterKey="):
                key_part, sep, value_part = token.partition(",ParameterValue=")
                if not sep:
                    raise ValueError(f"bad parameter override {token!r}")
                result[key_part.removeprefix("ParameterKey=")] = value_part
            else:
                key, sep, value = token.partition("=")
                if not sep or not key:
                    raise ValueError(f"bad parameter override {token!r} (expected KEY=VALUE)")
                result[key] = value
    return result


def _functions(template: Path, overrides: dict[str, str], region: str) -> dict[str, FunctionSpec]:
    """The template's functions as :func:`tools.template.resolve` makes them, kept in
    ``.scratch/invoke`` by the template's and this tooling's text, the overrides and the region:
    moto's CloudFormation takes seconds to import, and `make invoke` is run again and again."""
    import hashlib

    from tools import template as tooling

    texts = [template.read_text(), Path(tooling.__file__).read_text()]
    key = hashlib.sha256(json.dumps([*texts, sorted(overrides.items()), region]).encode()).hexdigest()[:32]
    cache = tooling.ROOT / ".scratch" / "invoke" / f"{key}.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    base = template.resolve().parent  # paths are kept relative to the template's directory
    with open(cache.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent invocations: one resolves, the others read it
        if not cache.exists():
            functions = tooling.resolve(overrides, template, region).functions
            resolved = {lid: dataclasses.asdict(f) for lid, f in functions.items()}
            for f in resolved.values():
                f["code_dir"], f["layer_dirs"] = (os.path.relpath(f["code_dir"], base),
                                                  [os.path.relpath(d, base) for d in f["layer_dirs"]])
            cache.write_text(json.dumps(resolved))
        saved = json.loads(cache.read_text())
    return {lid: tooling.Function(**{**f, "code_dir": (base / f["code_dir"]).resolve(),
                                     "layer_dirs": [(base / d).resolve() for d in f["layer_dirs"]]})
            for lid, f in saved.items()}


def _read_event(source: str | None) -> Any:
    if source is None:
        return {}
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    return json.loads(text) if text.strip() else {}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.local_invoke",
        description="Invoke one function of a SAM template locally, without Docker, like `sam local invoke`.",
    )
    parser.add_argument(
        "function", nargs="?", help="logical id of the function (optional if the template has only one)"
    )
    parser.add_argument("-e", "--event", help="JSON event file, or - to read it from stdin (default: {})")
    parser.add_argument(
        "-n", "--env-vars", help='SAM env-vars JSON: {"Parameters": {...}, "<FunctionLogicalId>": {...}}'
    )
    parser.add_argument(
        "--parameter-overrides",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="template parameter values (KEY=VALUE or ParameterKey=K,ParameterValue=V)",
    )
    parser.add_argument(
        "-t", "--template", default="template.yaml", help="template file (default: template.yaml)"
    )
    parser.add_argument("--region", default=None, help="AWS region (default: $AWS_REGION or us-east-1)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (the handler process's)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        region = args.region or _region(os.environ)
        functions = _functions(Path(args.template), parse_parameter_overrides(args.parameter_overrides), region)
        function = args.function
        if function is None:
            if len(functions) != 1:
                parser.error(f"name the function to invoke, one of: {', '.join(functions)}")
            function = next(iter(functions))
        if function not in functions:
            parser.error(f"{function!r} is not a function of {args.template}: {', '.join(functions)}")
        spec = functions[function]
        if args.env_vars:
            env_vars = json.loads(Path(args.env_vars).read_text(encoding="utf-8"))
            spec = apply_env_vars(spec, env_vars, warn=sys.stderr)
        event = _read_event(args.event)
    except Exception as error:  # a template or parameter moto's CloudFormation refuses, a missing file
        print(f"local_invoke: {error}", file=sys.stderr)
        return 2
    extra_env = {"AWS_REGION": region, "AWS_DEFAULT_REGION": region} if args.region else None
    result = invoke_subprocess(spec, event, extra_env=extra_env, stream_stderr=sys.stderr)
    sys.stdout.write(result.stdout if result.stdout.endswith("\n") else result.stdout + "\n")
    sys.stdout.flush()
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
