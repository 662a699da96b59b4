"""A Docker-free stand-in for ``sam local invoke`` (``make invoke``)::

    python -m tools.local_invoke PollFunction -e events/poll.json \\
        [--env-vars env.json] [--parameter-overrides K=V ...] [--template template.yaml] [--region R]

The function is resolved as the in-process stack resolves it (:func:`tools.template.resolve`), kept in
``.scratch/invoke`` for the next run with the same template, parameters and region, and its handler runs in a fresh
Python process (sam's fresh container): ``sys.path`` starts with its code dir and layers; the environment is this
one's, Lambda's variables, then the function's own; the context counts down from its Timeout. The result goes to
stdout, whatever the handler logs or prints to stderr. A handler that raises exits 1 (Lambda's error document on
stdout); one still running at its Timeout is ended by an interval timer's SIGALRM (even one holding the GIL), its
process group killed, and exits 124 ("Function timed out after N s"). Only the standard library is imported at
import time: the child loads this file by path, the repository off its sys.path.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import decimal
import fcntl
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from tools.template import Function as FunctionSpec

ACCOUNT_ID = "123456789012"
DEFAULT_REGION = "us-east-1"
#: Exit code of an invocation that ran past the function's Timeout (as timeout(1) uses).
TIMEOUT_EXIT_CODE = 124
#: Time allowed for interpreter start-up and the handler module's import (Lambda's init limit).
INIT_TIMEOUT_S = 10.0
_BOOTSTRAP = ("import importlib.util as u, sys; s = u.spec_from_file_location('_local_invoke', {path!r}); "
              "m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m); m._child()")


def _log_stream_name() -> str:
    return f"{dt.datetime.now(dt.UTC):%Y/%m/%d}/[$LATEST]{uuid.uuid4().hex}"


def _region(env: Mapping[str, str]) -> str:
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


class LambdaContext:
    """The ``context`` argument of a Python Lambda handler (what Powertools reads from it)."""

    def __init__(self, function_name: str, memory_limit_in_mb: int, timeout_s: float,
                 aws_request_id: str | None = None, region: str = DEFAULT_REGION) -> None:
        self.function_name, self.function_version = function_name, "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{region}:{ACCOUNT_ID}:function:{function_name}"
        self.memory_limit_in_mb = int(memory_limit_in_mb)
        self.aws_request_id = aws_request_id or str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = os.environ.get("AWS_LAMBDA_LOG_STREAM_NAME") or _log_stream_name()
        self.identity = self.client_context = self.tenant_id = None  # none locally
        self._deadline = time.monotonic() + float(timeout_s)

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before the function's Timeout (never negative)."""
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def make_context(spec: FunctionSpec, request_id: str | None = None) -> LambdaContext:
    """A fresh context for an in-process call of ``spec``'s handler (deadline = now + Timeout)."""
    return LambdaContext(spec.function_name, spec.memory, spec.timeout, request_id, _region(os.environ))


def prepare_environment(spec: FunctionSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The handler process's environment: ``base`` (default: this process's: PATH, credentials, AWS_ENDPOINT_URL...),
    the variables Lambda sets, then the function's own, which win. AWS_REGION and AWS_DEFAULT_REGION default to each
    other, else us-east-1."""
    env = dict(os.environ if base is None else base)
    env.update({"AWS_LAMBDA_FUNCTION_NAME": spec.function_name, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory),
                "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST", "AWS_LAMBDA_FUNCTION_TIMEOUT": str(spec.timeout),
                "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.function_name}",
                "AWS_LAMBDA_LOG_STREAM_NAME": _log_stream_name(), "AWS_EXECUTION_ENV": f"AWS_Lambda_{spec.runtime}",
                "AWS_SAM_LOCAL": "true", "LAMBDA_TASK_ROOT": str(spec.code_dir), "_HANDLER": spec.handler,
                "TZ": ":UTC", **spec.environment})
    env.setdefault("AWS_REGION", _region(env))
    env.setdefault("AWS_DEFAULT_REGION", env["AWS_REGION"])
    return env


def apply_env_vars(spec: FunctionSpec, env_vars: Mapping[str, Any], warn: IO[str] | None = None) -> FunctionSpec:
    """``spec`` under a SAM ``--env-vars`` document: ``Parameters`` applies to every function, the entry keyed by the
    function's logical id (or else its FunctionName) to this one, and wins. As sam does, only variables the function
    declares are set; the others are ignored (said on ``warn``)."""
    overrides = {**(env_vars.get("Parameters") or {}),
                 **(env_vars.get(spec.logical_id) or env_vars.get(spec.function_name) or {})}
    ignored = sorted(set(overrides) - set(spec.environment))
    if ignored and warn is not None:
        print(f"local_invoke: env-vars not declared in {spec.logical_id}'s Environment are ignored (as sam does): "
              f"{', '.join(ignored)}", file=warn)

    def text(value: Any) -> str:  # as sam turns a JSON value into a variable
        return "" if value is None else str(value).lower() if isinstance(value, bool) else (
            str(value) if isinstance(value, str | int | float) else json.dumps(value))

    return dataclasses.replace(spec, environment={
        **spec.environment, **{k: text(v) for k, v in overrides.items() if k in spec.environment}})


@dataclasses.dataclass(frozen=True)
class InvokeResult:
    """One invocation: the child's exit code, the parsed result (or Lambda's error document), its stdout and stderr."""

    returncode: int
    payload: Any
    stdout: str
    stderr: str


def _python_paths(spec: FunctionSpec) -> list[str]:
    """Code dir, then each layer's dir (its ``python/`` subdir when built by ``sam build``)."""
    layers = map(Path, spec.layer_dirs)
    return [str(spec.code_dir), *(str(p / "python" if (p / "python").is_dir() else p) for p in layers)]


def invoke_subprocess(spec: FunctionSpec, event: Any, extra_env: Mapping[str, str] | None = None,
                      timeout: float | None = None, stream_stderr: IO[str] | None = None) -> InvokeResult:
    """Run ``spec``'s handler once on ``event`` in a fresh interpreter. ``extra_env`` goes over the function's
    variables; ``timeout`` replaces its Timeout; ``stream_stderr`` (a file) gets the child's logs as they come
    instead of the result's ``stderr``."""
    timeout_s = float(spec.timeout if timeout is None else timeout)
    env = {**prepare_environment(spec), **(extra_env or {})}
    config = {"handler": spec.handler, "paths": _python_paths(spec), "timeout": timeout_s, "event": event,
              "function_name": spec.function_name, "memory": spec.memory, "region": _region(env)}
    process = subprocess.Popen([sys.executable, "-c", _BOOTSTRAP.format(path=str(Path(__file__).resolve()))],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=spec.code_dir,
                               stderr=stream_stderr or subprocess.PIPE, start_new_session=True)
    hung = False
    try:  # its own process group: a timeout ends whatever the handler started, too
        out, err = process.communicate(json.dumps(config).encode(), timeout=timeout_s + INIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # a hung start-up: the handler's timer was never set
        hung = True
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    stdout, stderr = out.decode(errors="replace"), (err or b"").decode(errors="replace")
    if hung or process.returncode == -signal.SIGALRM:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        message = f"Function timed out after {timeout_s:g} s"
        if stream_stderr is not None:
            print(message, file=stream_stderr, flush=True)
        payload: Any = {"errorType": "Sandbox.Timedout", "errorMessage": message}
        return InvokeResult(TIMEOUT_EXIT_CODE, payload, json.dumps(payload), stderr + message + "\n")
    try:
        payload = json.loads(stdout) if stdout.strip() else None
    except ValueError:
        payload = None
    return InvokeResult(process.returncode, payload, stdout, stderr)


def _json_default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _error(error: BaseException, error_type: str | None = None) -> dict[str, Any]:
    return {"errorMessage": str(error), "errorType": error_type or type(error).__name__,
            "stackTrace": traceback.format_tb(error.__traceback__)}


def _child() -> None:  # pragma: no cover - runs in the child process
    """One invocation: its config on stdin, the result on the original stdout (fd 1 is then stderr)."""
    config = json.load(sys.stdin)
    result = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path[:] = [*config["paths"], *(p for p in sys.path if p not in ("", "."))]

    def finish(code: int, document: Any) -> NoReturn:
        result.write((document if isinstance(document, str) else json.dumps(document)) + "\n")
        result.flush()
        sys.stderr.flush()
        os._exit(code)

    module, _, name = config["handler"].rpartition(".")
    try:
        handler = getattr(importlib.import_module(module.replace("/", ".")), name)
    except Exception as error:
        traceback.print_exc()
        finish(1, _error(error, "Runtime.ImportModuleError"))
    context = LambdaContext(config["function_name"], config["memory"], config["timeout"], region=config["region"])
    signal.setitimer(signal.ITIMER_REAL, config["timeout"])  # SIGALRM's default action ends the process
    try:
        value = handler(config["event"], context)
    except BaseException as error:  # Lambda reports SystemExit & co. too
        signal.setitimer(signal.ITIMER_REAL, 0)
        error.__traceback__ = error.__traceback__.tb_next if error.__traceback__ else None  # the handler's frames
        traceback.print_exception(error)
        finish(1, _error(error))
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        text = json.dumps(value, default=_json_default)
    except (TypeError, ValueError) as error:
        traceback.print_exc()
        finish(1, _error(error, "Runtime.MarshalError"))
    finish(0, text)


def parse_parameter_overrides(items: Sequence[str]) -> dict[str, str]:
    """SAM's ``--parameter-overrides``: ``K=V`` or ``ParameterKey=K,ParameterValue=V`` items."""
    result: dict[str, str] = {}
    for token in (t for item in items for t in shlex.split(item)):
        if token.startswith("ParameterKey="):
            key, sep, value = token.removeprefix("ParameterKey=").partition(",ParameterValue=")
        else:
            key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError(f"bad parameter override {token!r} (expected KEY=VALUE)")
        result[key] = value
    return result


def functions(template: Path, overrides: Mapping[str, str], region: str) -> dict[str, FunctionSpec]:
    """The template's functions as :func:`tools.template.resolve` makes them, kept in ``.scratch/invoke`` by the
    template (its path and text), tools/template.py's text, the overrides and the region (a resolve imports moto's
    CloudFormation: seconds; `make invoke` runs again and again)."""
    import hashlib
    import pickle

    from tools import template as tooling

    key = [str(template.resolve()), template.read_text(), Path(tooling.__file__).read_text(), sorted(overrides.items()),
           region]
    cache = tooling.ROOT / ".scratch" / "invoke" / f"{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]}"
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent invocations: one resolves, the others read it
        if not cache.exists():
            cache.write_bytes(pickle.dumps(tooling.resolve(overrides, template, region).functions))
        functions: dict[str, FunctionSpec] = pickle.loads(cache.read_bytes())  # noqa: S301 - this tool's own file
        return functions


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; the handler process's exit code."""
    parser = argparse.ArgumentParser(prog="python -m tools.local_invoke", description=__doc__.split("\n")[0])
    parser.add_argument("function", nargs="?", help="logical id of the function (optional if there is only one)")
    parser.add_argument("-e", "--event", help="JSON event file, or - to read it from stdin (default: {})")
    parser.add_argument("-n", "--env-vars", help='SAM env-vars JSON: {"Parameters": {...}, "<LogicalId>": {...}}')
    parser.add_argument("--parameter-overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="template parameter values (KEY=VALUE or ParameterKey=K,ParameterValue=V)")
    parser.add_argument("-t", "--template", default="template.yaml", help="template file (default: template.yaml)")
    parser.add_argument("--region", help="AWS region (default: $AWS_REGION or us-east-1)")
    args = parser.parse_args(argv)
    region = args.region or _region(os.environ)
    try:
        found = functions(Path(args.template), parse_parameter_overrides(args.parameter_overrides), region)
        name = args.function or (next(iter(found)) if len(found) == 1 else None)
        if name not in found:
            parser.error(f"{name or 'no function'!r} is not a function of {args.template}: {', '.join(found)}")
        spec = found[name]
        if args.env_vars:
            spec = apply_env_vars(spec, json.loads(Path(args.env_vars).read_text(encoding="utf-8")), sys.stderr)
        text = "" if args.event is None else sys.stdin.read() if args.event == "-" else Path(args.event).read_text()
        event = json.loads(text) if text.strip() else {}
    except Exception as error:  # a template or parameter moto's CloudFormation refuses, a missing file
        print(f"local_invoke: {error}", file=sys.stderr)
        return 2
    extra_env = {"AWS_REGION": region, "AWS_DEFAULT_REGION": region} if args.region else None
    result = invoke_subprocess(spec, event, extra_env=extra_env, stream_stderr=sys.stderr)
    print(result.stdout.rstrip("\n"), flush=True)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
