"""What the learner's code does to the grader around it, seen as it happens: Python's audit events.

The seal (``seal.py``) compares the state of the grader's tools before and after the learner's code ran;
some tampering leaves no state behind. Reading a check's frame (``sys._getframe``, ``inspect``,
``gc.get_referrers``) changes nothing and learns the expected values, or reaches the context that keeps
the recording; rewriting the grader's files on disk changes the next process that imports them. Python
raises an *audit event* for each of these (PEP 578), and an audit hook, once added, can be neither
removed nor listed - so the hook and the notes it keeps are out of the learner's reach.

Who did it is read from the stack: the frames of the grader (``dpteach/grading``), of the standard
library, and of other libraries (torch, numpy, the rest of dpteach) are told apart by their files; any
other frame is the learner's (its cells, code it compiled). An event counts when the learner's code asked
for it directly, or through a standard-library helper that hands frames back (``inspect.currentframe``,
``traceback.walk_stack``, ``traceback.walk_tb``: for a traceback's frame, the first frame below the standard
library's decides); torch or ``collections.namedtuple`` reading a frame for their own purposes do not count,
nor does ``traceback.print_exc`` or ``format_exc``, which turn the frames into file names and lines. Writing into the
package, the standard library, the environment's libraries or the folder of the ranks' verdicts is
refused whoever asks (Python's own bytecode cache shrugs a refusal off), and reported when the learner
asked; so is opening the launch's payload (it holds the key that signs the verdicts: ``in_rank.py``) or a
process's memory.

**ctypes** reaches any object and any frame through raw memory (``PyEval_GetFrame``, a cast to
``py_object``) without the events above - but not without events of its own: every foreign symbol looked
up, library opened, address taken or function called raises a ``ctypes.*`` event. Nothing a learner
writes in these exercises needs ctypes, so any such event on the learner's behalf (the first frame that is
neither the standard library's nor another library's is the learner's) is tampering, as is importing it
(``forbidden.reaching``, before anything runs).

**Other channels than messages.** Each rank gets a scratch folder of its own (``in_rank.py``: ``TMPDIR`` and
``tempfile`` point there). While the learner's code runs, it may write there and nowhere else, and may
not open another rank's scratch folder; it may not start processes (a ``cat`` of the launch's payload
would need no ``open`` here) nor open sockets of its own. So ranks can only learn each other's data from
messages, which the traffic counts see (``dpteach/network/traffic.py``).

Notes only grow: :func:`notes` returns what was seen so far, and the rank compares counts before and
after a check (``seal.py``). Known limits: a frame passed to a signal handler is not audited.
"""
from __future__ import annotations

import _thread
import inspect
import logging
import os
import sys
import sysconfig
import traceback

GRADING_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
PACKAGE_DIR = os.path.dirname(GRADING_DIR.rstrip(os.sep)) + os.sep
TRYOUT = os.path.join(GRADING_DIR, "tryout.py")
_PATHS = sysconfig.get_paths()
STDLIB_DIR = os.path.realpath(_PATHS["stdlib"]) + os.sep
LIBRARY_DIRS = tuple(dict.fromkeys(os.path.realpath(p) + os.sep for p in (
    sys.prefix, sys.base_prefix, sys.exec_prefix, _PATHS["purelib"], _PATHS["platlib"])))
PROTECTED_DIRS = (PACKAGE_DIR, STDLIB_DIR) + LIBRARY_DIRS  # no rank writes here once the hook is added

# Reading frames, objects or code this way is how a check's frame or context is reached.
DIRECT = {"sys._getframe", "sys._getframemodulename", "sys._current_frames", "sys._current_exceptions",
          "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
          "code.__new__", "function.__new__", "marshal.loads", "sys.addaudithook"}
FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"}
# Standard-library functions that hand frames (or the values in them) back to whoever called them.
FRAME_HELPERS = {inspect.currentframe.__code__, inspect.stack.__code__, inspect.trace.__code__,
                 traceback.walk_stack.__code__, traceback.StackSummary.extract.__func__.__code__,
                 logging.currentframe.__code__}
# Standard-library functions that read frames and keep them: what comes out is file names, lines and function
# names (the values in the frames only with capture_locals=True, which they are then not trusted with).
FRAME_CONSUMERS = {traceback.StackSummary._extract_from_extended_frame_gen.__func__.__code__}
WRITES = {"os.rename", "os.remove", "os.rmdir", "os.link", "os.symlink", "os.chmod", "os.chown", "os.mkdir",
          "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copytree"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# For each writing event, which of its arguments are paths, each with the argument that holds the directory
# descriptor it is relative to (None: none). Python's own shutil.rmtree, for one, removes files by bare name
# relative to an open directory (os.unlink(name, dir_fd=fd)): read alone, the name would resolve against the
# working directory and a removal inside the scratch folder would look like one outside it.
PATH_ARGUMENTS = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
                  "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.rename": ((0, 2), (1, 3)),
                  "os.link": ((0, 2), (1, 3)), "os.symlink": ((0, None), (1, 2)), "shutil.rmtree": ((0, 1),)}
# Starting a process, or a socket of one's own: channels nobody counts, and ways around the audit.
PROCESSES = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
             "pty.spawn", "os.startfile"}
SOCKETS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}

_kinds: dict = {}


def kind(filename: str) -> str:
    """'grading', 'stdlib', 'library' or 'learner': whose code a frame with this file name runs."""
    found = _kinds.get(filename)
    if found is None:
        path = os.path.realpath(filename) if os.path.isabs(filename) else filename
        if path == TRYOUT or filename == TRYOUT:
            found = "library"  # the try cells' helper: made for learners, it judges nothing
        elif path.startswith(GRADING_DIR) or filename.startswith(GRADING_DIR):
            found = "grading"
        elif filename.startswith("<frozen ") or (path.startswith(STDLIB_DIR) and "-packages" + os.sep not in path):
            found = "stdlib"
        elif path.startswith(PACKAGE_DIR) or path.startswith(LIBRARY_DIRS):
            found = "library"
        else:
            found = "learner"
        _kinds[filename] = found
    return found


def first_not(kinds: tuple, frame):
    """The first frame from ``frame`` down the stack whose code is none of ``kinds``; None at the bottom."""
    while frame is not None and kind(frame.f_code.co_filename) in kinds:
        frame = frame.f_back
    return frame


def _is_learners(frame) -> bool:
    return frame is not None and kind(frame.f_code.co_filename) == "learner"


def _asked_by_learner(event: str, args, caller) -> bool:
    """Did the learner's code ask for this event (``caller``: the frame that triggered it)?"""
    if event == "object.__getattr__":
        if len(args) < 2 or args[1] not in FRAME_ATTRIBUTES or caller is None:
            return False
        # A frame is reached through the standard library (traceback.walk_tb, inspect.getinnerframes) as surely
        # as directly - and from it, f_back and f_locals (which raise no event) reach every frame above. So the
        # first frame that is not the standard library's decides, unless a standard-library function on the way
        # keeps the frames to itself: one that turns them into file names and lines (a printed traceback).
        frame = caller
        while frame is not None and kind(frame.f_code.co_filename) == "stdlib":
            if frame.f_code in FRAME_CONSUMERS and not frame.f_locals.get("capture_locals"):
                return False
            frame = frame.f_back
        return _is_learners(frame)
    if event in DIRECT:
        if _is_learners(caller):
            return True
        if event == "sys._getframe" and caller is not None and kind(caller.f_code.co_filename) == "stdlib":
            called = caller  # the standard-library function the learner's code called, if it did
            while called.f_back is not None and kind(called.f_back.f_code.co_filename) == "stdlib":
                called = called.f_back
            return called.f_code in FRAME_HELPERS and _is_learners(called.f_back)
        return event.startswith("gc.") and _is_learners(first_not(("stdlib",), caller))
    if event == "compile":  # code compiled under a grader's or a library's file name passes for theirs
        name = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
        return os.path.isabs(name) and kind(name) != "learner" and _is_learners(first_not(("stdlib",), caller))
    return False


def _paths(event: str, args) -> tuple[list, bool]:
    """The paths an event touches, and whether it writes to them."""
    if event == "open":
        path, mode, flags = (list(args) + [None, None, 0])[:3]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & WRITE_FLAGS)
        return [path], writes
    if event in WRITES:
        places = PATH_ARGUMENTS.get(event, ((0, None), (1, None)))
        return [_against(args[i], args[fd] if fd is not None and fd < len(args) else None)
                for i, fd in places if i < len(args) and isinstance(args[i], (str, bytes, os.PathLike))], True
    return [], False


def _against(path, dir_fd):
    """``path`` as the call meant it: relative to the directory open as ``dir_fd`` when one is given."""
    if not isinstance(dir_fd, int) or dir_fd < 0 or os.path.isabs(os.fsdecode(path)):
        return path
    try:
        return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fsdecode(path))
    except OSError:  # no /proc: the name alone, judged as before (conservatively)
        return path


def _real(path):
    try:
        return os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None


def _refused(event: str, args, protected: tuple, secret: tuple):
    """The path an event may not touch - written under ``protected``, or opened at all if ``secret`` or a
    process's memory - if any."""
    paths, writes = _paths(event, args)
    for path in paths:
        real = _real(path) if isinstance(path, (str, bytes, os.PathLike)) else None
        if real is None:
            continue
        if real in secret or (real.startswith("/proc/") and real.endswith("/mem")) or (
                writes and real.startswith(protected)):
            return real
    return None


_notes: list = []
_installed: list = []


def _learner_asked(caller) -> bool:
    """Is the first frame below ``caller`` that is not the standard library's nor a library's the learner's?"""
    return _is_learners(first_not(("stdlib", "library"), caller))


learner_below = _learner_asked


def _outside_scratch(event: str, args, scratch: tuple):
    """With ``scratch`` = (every rank's scratch root, this rank's folder): the path the learner's code may not
    touch - written outside its own folder, or opened at all in another rank's - if any."""
    root, own = scratch
    paths, writes = _paths(event, args)
    for path in paths:
        real = _real(path) if isinstance(path, (str, bytes, os.PathLike)) else None
        if real is None or (real + os.sep).startswith(own):
            continue
        if writes or (real + os.sep).startswith(root):
            return real
    return None


def install(protected=(), secret=(), scratch=None) -> None:
    """Add the audit hook (once per process: a hook cannot be removed). Call before the learner's code loads.

    Besides the package, the standard library and the libraries, nothing may write under ``protected`` (the
    folder of the ranks' results), and nothing may open ``secret`` files (the launch's payload, which holds
    the key that signs the ranks' verdicts) or a process's memory (``/proc/*/mem``). ``scratch``: (the root
    of every rank's scratch folder, this rank's) - the learner's code writes only in its own."""
    if _installed:
        return
    protected = PROTECTED_DIRS + tuple(os.path.realpath(p) + os.sep for p in protected if p)
    secret = tuple(os.path.realpath(p) for p in secret if p)
    scratch = tuple(os.path.realpath(p) + os.sep for p in scratch) if scratch else None
    busy = set()  # threads inside the hook: its own frame reading raises events too

    def hook(event, args):
        ctypes_event = event.startswith("ctypes.")
        if not ctypes_event and event not in DIRECT and event not in WRITES and event not in PROCESSES and \
                event not in SOCKETS and event not in ("object.__getattr__", "compile", "open"):
            return
        me = _thread.get_ident()
        if me in busy:
            return
        busy.add(me)
        try:
            caller = sys._getframe(1)
            refused = _refused(event, args, protected, secret)
            if refused is not None:
                cache = os.sep + "__pycache__" + os.sep in refused and ".pyc" in refused  # Python's own cache
                if not cache and (refused in secret or _is_learners(first_not(("stdlib", "library"), caller))):
                    _notes.append(f"opened {refused}, which belongs to the grader or a library")
                raise PermissionError(f"{refused}: the grader's and the libraries' files are out of bounds while "
                                      f"an exercise is graded")
            if _asked_by_learner(event, args, caller):
                what = f"{event} {args[1]}" if event == "object.__getattr__" else event
                _notes.append(f"called {what}, which reaches into the grader's frames and objects")
            elif (ctypes_event or event in PROCESSES or event in SOCKETS) and _learner_asked(caller):
                what = ("used ctypes, which reaches into the grader's memory and frames" if ctypes_event else
                        f"called {event}: ranks may exchange data only as messages of their process group,"
                        f" and nothing may run outside the grader's watch")
                _notes.append(f"{what} ({event})" if ctypes_event else what)
                raise PermissionError(f"{event} is out of bounds while an exercise is graded")
            elif scratch is not None and _learner_asked(caller):
                outside = _outside_scratch(event, args, scratch)
                if outside is not None and os.sep + "__pycache__" + os.sep in outside:
                    raise PermissionError(outside)  # Python's own bytecode cache: it shrugs a refusal off
                if outside is not None:
                    _notes.append(f"wrote or read {outside}, outside this rank's own scratch folder: data must "
                                  f"travel as messages (send/recv), not through files")
                    raise PermissionError(f"{outside}: outside this rank's scratch folder")
        finally:
            busy.discard(me)

    sys.addaudithook(hook)
    _installed.append(True)


def note(text: str) -> None:
    """Add what the grader saw the learner's code do (the guard notes calls into the grader's code)."""
    _notes.append(text)


def notes() -> tuple:
    """Everything seen of the learner's code so far, oldest first."""
    return tuple(_notes)
