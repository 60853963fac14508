"""The hidden-test runner, run by the grader in the jail with ``python -I -S -c`` (standard library only).

It reads its orders on stdin (the report descriptor, the run's key, the named test ids), then points stdin at
/dev/null, so the key is in no file, no argument and no environment variable. Before any code of the
repository runs it imports the framework, compiles the hidden tests from their files, takes a copy of the
framework's classes and modules, and installs an audit hook that refuses, from then on, the ways Python
code reaches another frame's objects or the process's memory: frames (``sys._getframe``, ``tb_frame`` and
the like), the garbage collector's object lists, ctypes, opening anything in /proc, setting attributes of
the framework's classes or a function's code, starting processes, tracing. Then it runs the hidden test
modules (their imports run the patched code) and each named test on its own, checks after each one that
the framework and the tests' own code are those it started with, and sends one line per event over the
report descriptor, each signed with the run's key (HMAC-SHA256): ``start``, a ``result`` per named test,
``tampered`` if a check fails, ``finished``. Its exit status is 0 only when every named test passed.
Everything it needs is bound to local names of ``main`` before the patched code runs, so rebinding a
module attribute or a builtin cannot reach it. What this cannot rule out is in the README ("Grading").
"""


def main() -> None:
    import _hashlib
    import builtins
    import os
    import sys
    import types
    import unittest
    import unittest.case
    import unittest.loader
    import unittest.result
    import unittest.suite
    import unittest.util

    _str, _len, _type, _vars, _id, _sorted = str, len, type, vars, id, sorted
    _isinstance, _getattr, _callable, _exit, _write = isinstance, getattr, callable, os._exit, os.write
    _function, _classmethod, _staticmethod = types.FunctionType, classmethod, staticmethod
    _base_exception, _test_case, _test_result = BaseException, unittest.TestCase, unittest.TestResult

    orders = b""
    while chunk := os.read(0, 65536):
        orders += chunk
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    header, *named = orders.decode().splitlines()
    fd_text, key_text = header.split()
    report_fd = int(fd_text)
    key = bytearray.fromhex(key_text)
    signer = _hashlib.hmac_new(bytes(key), digestmod="sha256")
    for index in range(_len(key)):
        key[index] = 0
    del orders, header, key_text, key
    sequence = [0]

    def send(*fields: str) -> None:
        line = "\t".join([_str(sequence[0]), *fields])
        sequence[0] += 1
        digest = signer.copy()
        digest.update(line.encode())
        _write(report_fd, (digest.hexdigest() + "\t" + line + "\n").encode())

    class Result(_test_result):
        """Outcomes as text without walking tracebacks (which would read frames the audit hook refuses)."""

        def _exc_info_to_string(self, err, test):
            return f"{_getattr(err[0], '__name__', '?')}: {err[1]}"

    # unittest's assertRaises clears a caught exception's frames (reading tb_frame, refused below); keep them.
    unittest.case.traceback = types.SimpleNamespace(clear_frames=lambda tb: None)

    hidden = os.environ["HIDDEN"]
    sources = {}
    for name in _sorted(os.listdir(hidden)):
        if name.startswith("test") and name.endswith(".py"):
            with open(os.path.join(hidden, name), encoding="utf-8") as file:
                sources[name[:-3]] = compile(file.read(), f"{hidden}/{name}", "exec")
    hidden_codes = {}
    pending = [*sources.values()]
    while pending:
        code = pending.pop()
        hidden_codes[_id(code)] = code
        pending.extend(const for const in code.co_consts if _isinstance(const, types.CodeType))

    protected_classes = [
        _test_case, _test_result, Result, unittest.TestSuite, unittest.TestLoader, unittest.case._Outcome,
        unittest.case._AssertRaisesBaseContext, unittest.case._AssertRaisesContext, unittest.case._BaseTestCaseContext,
        unittest.case._SubTest, unittest.suite.BaseTestSuite, type, object, BaseException, AssertionError,
    ]
    protected_modules = [unittest, unittest.case, unittest.result, unittest.suite, unittest.loader, unittest.util, builtins, os]
    copies = [(f"{cls.__module__}.{cls.__qualname__}", _vars(cls), dict(_vars(cls))) for cls in protected_classes]
    copies += [(module.__name__, _vars(module), dict(_vars(module))) for module in protected_modules]
    functions = [
        (f"{label}.{name}", value, value.__code__, value.__defaults__, value.__kwdefaults__)
        for label, _, copy in copies
        for name, value in copy.items()
        if _type(value) is _function
    ]
    test_case_methods = {name for name, value in _vars(_test_case).items() if _callable(value)}
    protected_ids = {_id(cls) for cls in protected_classes}
    proc_device = os.stat("/proc/self").st_dev
    _stat = os.stat
    refused_events = {
        "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers",
        "gc.get_referents", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "subprocess.Popen", "pty.spawn", "os.symlink", "os.link", "os.chdir", "os.fchdir",
    }
    frame_attributes = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals", "f_globals"}

    def audit(event, args):
        """Never bypassed: the runner itself does nothing it refuses once the patched code may run."""
        refused = event in refused_events or event.startswith("ctypes.")
        if event == "object.__getattr__":
            refused = args[1] in frame_attributes
        elif event in ("object.__setattr__", "object.__delattr__"):
            refused = _id(args[0]) in protected_ids or args[1] == "__code__"
        elif event == "open" and (_type(args[0]) is _str or _type(args[0]) is bytes):
            try:
                refused = _stat(args[0]).st_dev == proc_device
            except OSError:
                refused = False
        if refused:
            raise RuntimeError(f"the grader refuses {event} while the hidden tests run")

    def describe(error) -> str:
        """An exception as text (its __str__ may be the patched code's: it runs under the audit hook like the rest)."""
        try:
            return f"{_type(error).__name__}: {error}"[:500]
        except _base_exception:
            return "an exception that cannot be shown"

    def out(text: str) -> None:
        _write(1, (text + "\n").encode())

    def tampered() -> str | None:
        """What of the framework differs from the copy taken before the patched code ran (None: nothing)."""
        for label, live, copy in copies:
            # A class must stay as it was; a module may gain attributes (importing unittest.mock adds one).
            if _type(live) is not dict and _len(live) != _len(copy):
                return f"{label} gained or lost attributes"
            for name, value in copy.items():
                if live.get(name, tampered) is not value:
                    return f"{label}.{name} was replaced"
        for label, function, code, defaults, kwdefaults in functions:
            if function.__code__ is not code or function.__defaults__ is not defaults or function.__kwdefaults__ is not kwdefaults:
                return f"{label} was changed in place"
        if sys.gettrace() is not None or sys.getprofile() is not None:
            return "a trace or profile function was set"
        return None

    def hidden_function(value, module_dict) -> bool:
        return _type(value) is _function and hidden_codes.get(_id(value.__code__)) is value.__code__ and value.__globals__ is module_dict

    def foreign(cls, module_dict) -> str | None:
        """Why the test class ``cls`` is not the hidden tests' own (None: it is)."""
        if _type(cls) is not _type or _test_case not in cls.__mro__:
            return "the test class is not a plain unittest.TestCase subclass"
        for klass in cls.__mro__[: cls.__mro__.index(_test_case)]:
            for name, value in _vars(klass).items():
                if _type(name) is not _str:
                    return f"{klass.__qualname__} has an attribute that is not named by a string"
                inner = value.__func__ if _type(value) is _classmethod or _type(value) is _staticmethod else value
                if _type(inner) is _function:
                    if not hidden_function(inner, module_dict):
                        return f"{klass.__qualname__}.{name} is not the hidden tests' code"
                elif _callable(inner) or name in test_case_methods:
                    return f"{klass.__qualname__}.{name} is not the hidden tests' code"
        return None

    def outcome_of(test, result, module_dict) -> str:
        for name in _vars(test):
            if _type(name) is not _str or name in test_case_methods:
                return "tampered\ta framework method was set on the test instance"
        funcs = test.__dict__.get("_type_equality_funcs")
        if _type(funcs) is not dict:
            return "tampered\tthe equality functions were replaced"
        for value in funcs.values():
            if _type(value) is not _str and not hidden_function(value, module_dict):
                return "tampered\tan equality function was replaced"
        problems = result.errors + result.failures
        if problems:
            return f"failed\t{problems[0][1]}"
        if result.skipped or result.expectedFailures or result.unexpectedSuccesses:
            return "failed\tskipped, or marked as an expected failure"
        return "passed\t" if result.testsRun == 1 else "failed\tdid not run"

    send("start", _str(_len(named)))
    sys.addaudithook(audit)
    sys.path.append(os.getcwd())
    modules, import_errors = {}, {}
    for name, code in sources.items():
        module = types.ModuleType(name)
        module.__file__ = code.co_filename
        sys.modules[name] = modules[name] = module
        try:
            exec(code, module.__dict__)
        except _base_exception as error:
            import_errors[name] = describe(error)
    changed = tampered()
    if changed is not None:
        send("tampered", f"at import: {changed}")
        sys.stdout.flush()
        out(f"the framework was changed while the hidden tests were imported: {changed}")
        _exit(1)
    passed = 0
    for test_id in named:
        module_name, _, rest = test_id.partition(".")
        class_name, _, method = rest.partition(".")
        module = modules.get(module_name)
        cls = module.__dict__.get(class_name) if module is not None else None
        if module_name in import_errors:
            outcome = f"failed\tthe test module does not import: {import_errors[module_name]}"
        elif _type(cls) is not _type or _type(_vars(cls).get(method)) is not _function and _type(_getattr(cls, method, None)) is not _function:
            outcome = "missing\tno such test"
        elif (why := foreign(cls, module.__dict__)) is not None:
            outcome = f"tampered\t{why}"
        else:
            protected_ids.add(_id(cls))
            result = Result()
            try:
                test = cls(method)
                test(result)
            except _base_exception as error:
                test = None
                result.errors.append((None, f"escaped the test: {describe(error)}"))
            changed = tampered()
            if changed is not None:
                outcome = f"tampered\t{changed}"
            elif test is None:
                outcome = f"failed\t{result.errors[-1][1]}"
            else:
                outcome = outcome_of(test, result, module.__dict__)
        kind, _, detail = outcome.partition("\t")
        if kind == "tampered":
            send("tampered", f"{test_id}: {detail}")
            out(f"the framework was changed while {test_id} ran: {detail}")
            _exit(1)
        send("result", test_id, kind, detail.replace("\n", " ").replace("\t", " ")[:500])
        out(f"{kind} {test_id}" + (f": {detail}" if detail else ""))
        passed += kind == "passed"
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except _base_exception:
            pass
    send("finished", _str(passed))
    out(f"{passed} of {_len(named)} named tests passed")
    _exit(0 if passed == _len(named) else 1)


if __name__ == "__main__":
    main()
