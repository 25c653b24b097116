"""`kinetic chat MODEL`: a conversation in the terminal, on prompt_toolkit's line editor.

Owns the terminal side of chat: the header (model, device, context), reading messages (history,
multi-line paste, a line ending in \\ goes on on the next), the slash commands, streaming answers
(reasoning dimmed) and Ctrl+C, which stops the answer being written and keeps the program (the
answer runs in a worker thread and stops within one pass), and Zero Wait's thread, which runs the
conversation ahead on every edit of the message being typed (ChatSession.run_ahead). Ctrl+D or
/exit quits. With stdin not a terminal, each line is one message and each answer is printed
(scripts, tests). Does not own the conversation (chat_session.py) nor the shared options (run_cmd,
runtime_options, llama_flags).
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import sys
import threading

from kinetic.cli.chat_session import REASONING, ChatSession
from kinetic.cli.llama_flags import CHAT, add_llama_flags
from kinetic.cli.run_cmd import add_generation_args, receipt_inputs, write_answer_receipt
from kinetic.cli.runtime_options import add_runtime_args, check_runtime_args, load_model
from kinetic.cli.sampling_options import apply_sampling, sampling_changes
from kinetic.devices import DEVICE_NAMES
from kinetic.errors import KineticError
from kinetic.ktc.keys import read_signing_key

HELP = """\
/clear            start a new conversation
/system [TEXT]    set the system prompt and start over; /system alone clears it
/think            turn the model's reasoning on or off (shown dimmed)
/temp X, /top-p X, /top-k N, /min-p X    change sampling for the next answers
/seed [N]         repeatable answers with seed N; /seed alone: a fresh seed each time
/sampling         show the sampling settings
/receipt [FILE]   write the receipt of the last answer to FILE, or print it
/help             this list
/exit, /quit      quit (Ctrl+D does too); Ctrl+C stops an answer"""
DIM, RESET = "\x1b[2m", "\x1b[0m"
_SAMPLING_COMMANDS = {"/temp": ("temperature", float), "/top-p": ("top_p", float), "/top-k": ("top_k", int),
                      "/min-p": ("min_p", float)}


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="chat in the terminal",
                       description="Chat with a model in the terminal; /help lists the commands.")
    p.add_argument("model", nargs="?", help="a .gguf or .ktc file or a downloaded model's name")
    p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL", help="the model, as llama.cpp takes it")
    p.add_argument("-p", "--prompt", dest="prompt_flag", metavar="TEXT",
                   help="the first message, answered before the chat goes on (as llama-cli's -p)")
    add_generation_args(p, reasoning_default="off")
    add_runtime_args(p)
    p.add_argument("--sign-key", metavar="FILE", help="sign /receipt's receipts with this Ed25519 secret key file")
    p.add_argument("--force", action="store_true", help="let /receipt FILE replace an existing FILE")
    p.add_argument("--ignore-eos", action="store_true",
                   help="go on past the model's end of turn, to -n tokens or a full context (as llama.cpp's)")
    add_llama_flags(p, CHAT)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    spec = args.model_flag or args.model
    if not spec:
        raise KineticError("no model given", "Usage: kinetic chat MODEL; see `kinetic chat --help`.")
    check_runtime_args(args)
    changes = sampling_changes(args)
    key = read_signing_key(args.sign_key) if args.sign_key else None  # read before the model loads
    model = load_model(args, spec)
    session = ChatSession(model, apply_sampling(model.sampling_defaults(), changes),
                          max_tokens=None if args.n_predict <= 0 else args.n_predict, system=args.system,
                          reasoning=args.reasoning, ignore_eos=getattr(args, "ignore_eos", False))
    chat = _Chat(session, args, key)
    if args.prompt_flag:
        chat.handle(args.prompt_flag)
    if sys.stdin.isatty():
        return chat.interactive()
    return chat.lines(sys.stdin)


class _Chat:
    def __init__(self, session: ChatSession, args: argparse.Namespace, key):
        self.session, self.args, self.key = session, args, key
        self.color = sys.stdout.isatty()

    # -- reading -------------------------------------------------------------------------------------

    def interactive(self) -> int:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import InMemoryHistory

        self._header()
        _let_ctrl_c_through()
        reader = PromptSession(history=InMemoryHistory(), key_bindings=_continuation_keys())
        ahead = _RunAhead(self.session)  # Zero Wait: every edit of the message runs the conversation ahead
        reader.default_buffer.on_text_changed += lambda buffer: ahead.typed(buffer.text)
        while True:
            try:
                text = reader.prompt("> ")
            except KeyboardInterrupt:
                continue  # Ctrl+C at the prompt clears the line
            except EOFError:
                return 0
            if self.handle(text) is False:
                return 0

    def lines(self, stream) -> int:
        """stdin not a terminal: one message per line, each answer printed."""
        for line in stream:
            if self.handle(line.rstrip("\n")) is False:
                break
        return 0

    def handle(self, text: str) -> bool:
        """One line: a command or a message. False to quit."""
        text = text.strip()
        if not text:
            return True
        try:
            if text.startswith("/"):
                return self._command(text)
            self._ask(text)
        except KineticError as e:
            self._note(f"kinetic: {e.message}" + (f"\n{e.hint}" if e.hint else ""))
        return True

    # -- answering -----------------------------------------------------------------------------------

    def _ask(self, text: str) -> None:
        """Stream the answer; the generation runs in a worker thread so Ctrl+C can stop it cleanly."""
        cancelled, events = threading.Event(), queue.Queue()

        def work():
            try:
                for item in self.session.answer(text, cancelled):
                    events.put(item)
            except BaseException as e:  # handed to the main thread, which raises it
                events.put(e)
            events.put(None)

        threading.Thread(target=work, name="chat-answer", daemon=True).start()
        stopped = False
        while True:
            try:
                item = events.get(timeout=0.1)
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                self._write(*item)
            except queue.Empty:
                continue
            except KeyboardInterrupt:  # the answer stops within one pass; its end still arrives
                cancelled.set()
                stopped = True
        sys.stdout.write(RESET + "\n" if self.color else "\n")
        sys.stdout.flush()
        self._status(stopped)

    def _write(self, kind: str, text: str) -> None:
        if kind == REASONING and self.color:
            text = DIM + text + RESET
        sys.stdout.write(text)
        sys.stdout.flush()

    def _status(self, stopped: bool) -> None:
        turn = self.session.last
        f = turn.finished
        new = len(turn.prompt_ids) - turn.reused
        speed = f.generated_tokens / f.generate_seconds if f.generate_seconds else 0.0
        prompt_speed = new / f.prompt_seconds if f.prompt_seconds else 0.0
        self._note(("[stopped] " if stopped else "") + f"[{f.generated_tokens} tokens at {speed:.1f} tok/s; prompt "
                   f"{new} new tokens at {prompt_speed:.1f} tok/s, {turn.reused} reused]")

    # -- commands ------------------------------------------------------------------------------------

    def _command(self, text: str) -> bool:
        name, _, rest = text.partition(" ")
        rest = rest.strip()
        s = self.session
        if name in ("/exit", "/quit"):
            return False
        if name == "/help":
            print(HELP)
        elif name == "/clear":
            s.clear()
            self._note("new conversation")
        elif name == "/system":
            s.set_system(rest)
            self._note("system prompt set; new conversation" if rest else "system prompt cleared; new conversation")
        elif name == "/think":
            self._think()
        elif name in _SAMPLING_COMMANDS:
            field, kind = _SAMPLING_COMMANDS[name]
            s.set_sampling(**{field: _number(name, rest, kind)})
            self._note(s.settings_text())
        elif name == "/seed":
            s.set_sampling(seed=_number(name, rest, int) if rest else -1)
            self._note(s.settings_text())
        elif name == "/sampling":
            self._note(s.settings_text())
        elif name == "/receipt":
            self._receipt(rest or None)
        else:
            self._note(f"unknown command {name}; /help lists the commands")
        return True

    def _think(self) -> None:
        if not self.session.thinks:
            self._note("this model does not reason: its chat template has no <think> block, so /think changes nothing")
            return
        self._note(f"reasoning {self.session.toggle_reasoning()}")

    def _receipt(self, path: str | None) -> None:
        from kinetic.receipts import Answer, make_receipt

        turn, s = self.session.last, self.session
        if turn is None:
            raise KineticError("there is no answer yet to write a receipt of", "Ask something first.")
        if s.ignore_eos:
            raise KineticError("a receipt records answers that end at the model's end of turn, and --ignore-eos "
                               "is on", "Start chat without --ignore-eos to write receipts.")
        answer = Answer(model_path=s.model.path, device=self.args.device, n_ctx=s.model.n_ctx, input=turn.messages,
                        prompt_ids=turn.prompt_ids, sampling=turn.finished.settings, max_tokens=s.max_tokens,
                        finish=turn.finished.finish_reason, text=turn.text, output_ids=turn.finished.tokens,
                        options=s.model.options, adapters=tuple(s.model.adapters))
        if path is None:
            print(json.dumps(make_receipt(answer, self.key), indent=2))
            return
        write_answer_receipt(answer, path, force=self.args.force, key=self.key,
                             inputs=receipt_inputs(self.args, s.model.path))

    # -- output --------------------------------------------------------------------------------------

    def _header(self) -> None:
        model, context = self.session.model, self.args.context
        self._note(f"{model.name} on {DEVICE_NAMES[self.args.device]}, context {context.tokens} ({context.why}). "
                   f"/help lists the commands; Ctrl+D quits.")

    def _note(self, line: str) -> None:
        sys.stdout.flush()
        sys.stderr.write((DIM + line + RESET if self.color else line) + "\n")
        sys.stderr.flush()


class _RunAhead:
    """Zero Wait's thread: each edit of the message being typed cancels the run ahead in flight (it
    stops after its pass) and the latest draft goes to ChatSession.run_ahead, which gives way to the
    answer itself when Enter is pressed. Drafts arrive from prompt_toolkit's event loop, which must
    never wait for a pass: `typed` only queues."""

    def __init__(self, session: ChatSession):
        self.session = session
        self._drafts: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._loop, name="chat-ahead", daemon=True).start()

    def typed(self, text: str) -> None:
        self._drafts.put(text)
        self.session.cancel_ahead()

    def _loop(self) -> None:
        while True:
            text = self._drafts.get()
            while not self._drafts.empty():  # only the latest draft matters
                text = self._drafts.get_nowait()
            try:
                self.session.run_ahead(text)
            except KineticError:  # the answer to this message will say what is wrong
                continue


def _number(command: str, text: str, kind):
    try:
        return kind(text)
    except ValueError:
        raise KineticError(f"{command} takes a number, not {text!r}", f"Example: {command} 0.7") from None


def _continuation_keys():
    """Enter sends the message, except after a trailing backslash, which becomes a new line."""
    from prompt_toolkit.key_binding import KeyBindings

    keys = KeyBindings()

    @keys.add("enter")
    def _(event):
        buffer = event.current_buffer
        if buffer.text.endswith("\\"):
            buffer.delete_before_cursor(1)
            buffer.insert_text("\n")
        else:
            buffer.validate_and_handle()

    return keys


def _let_ctrl_c_through() -> None:
    """Ctrl+C must stop an answer even when the program that started chat ignored or blocked SIGINT
    (both are inherited across exec, and Python keeps an inherited SIG_IGN instead of installing its
    KeyboardInterrupt handler): the interactive chat installs that handler and unblocks the signal."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
