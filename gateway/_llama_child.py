"""Entry point of the embedded model's child process: llama-cpp-python's OpenAI server, hardened.

Run as a script by :class:`gateway.local_model.LocalModelServer` (``python -P <this file>``, the
server settings as JSON on stdin); the gateway imports only ``PARENT_PID_ENV`` and ``STATS_PATH`` from
it, so nothing at module level here, or in the ``gateway._llama_*`` modules it imports, may import
llama.cpp. Before handing over to ``llama_cpp.server``'s app it does what the stock server cannot be
told to do:

* **Die with the parent.** ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux, so a gateway killed with
  SIGKILL (or OOM-killed) never leaves an orphaned model server holding memory and a port. Done here,
  after ``exec``, rather than in a ``preexec_fn``, which is unsafe in a threaded parent.
* **Settings from the parent only, and never on disk.** They arrive on stdin, so a gateway killed
  at any moment of start-up leaves no settings file behind. ``llama_cpp.server`` (pydantic-settings)
  fills every setting they leave out from a same-named environment variable, case-insensitively: an
  unrelated ``API_KEY`` in the gateway's environment would make the child demand it, ``PORT``/``HOST``
  would move it. Those variables are removed from the child's environment before the server reads it.
* **No extra weight-buffer types** (``use_extra_bufts = False``). llama.cpp moves quantised weights
  into AMX / repacked buffers when the CPU advertises those features. Some hypervisors advertise AMX
  but fault on its first instruction (``ldtilecfg``), which kills the server with SIGSEGV on the
  first multi-token prompt (seen on this project's Firecracker VMs). Plain CPU buffers work everywhere.
* **Logprobs without every prompt token's logits.** llama-cpp-python answers ``logprobs`` only for a
  model loaded with ``logits_all``, and then has llama.cpp compute the vocabulary logits of every
  prompt token, which completion logprobs never read (they read the row before each generated token:
  the prompt's last row, then each generated token's). :func:`_last_row_logits` evaluates every batch
  with logits for its last token only and stores that row where the stock code would, so a request
  that does not ask for logprobs costs what it costs without them, and one that does gets the same
  numbers. ``echo`` with ``logprobs``, which would read the prompt rows, is refused (400).

The rest lives in modules of their own, installed by :func:`_serve`:

* :mod:`gateway._llama_requests`: client errors as OpenAI 400s, request checks and rendering.
* :mod:`gateway._llama_grammar`: grammars llama.cpp cannot parse or survive are refused.
* :mod:`gateway._llama_guard`: the ASGI middleware in front of the app (disconnects, held-back stream
  headers, counters).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

from gateway._llama_grammar import unparsable_grammars_are_errors
from gateway._llama_guard import (
    STATS_PATH,
    Guard,
    Stats,
    error_mapper,
    stop_when_client_leaves,
    streams_end_their_generation,
)
from gateway._llama_requests import openai_client_errors, template_errors_are_client_errors

__all__ = ["PARENT_PID_ENV", "STATS_PATH", "main"]

PARENT_PID_ENV = "POINTSMAN_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    parent = os.environ.get(PARENT_PID_ENV)
    if not sys.platform.startswith("linux") or not parent:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    # The parent may have died between fork and prctl; then nobody would ever send the signal.
    if os.getppid() != int(parent):
        os._exit(1)


def _settings_from_parent_only() -> None:
    """Remove the environment variables pydantic-settings would read in place of missing settings."""
    from llama_cpp.server.settings import ConfigFileSettings, Settings

    names = {name.upper() for model in (Settings, ConfigFileSettings) for name in model.model_fields}
    names |= {"HOST", "PORT", "CONFIG_FILE"}  # read by llama_cpp.server directly, outside pydantic
    for key in list(os.environ):
        if key.upper() in names:
            del os.environ[key]


def _plain_cpu_buffers() -> None:
    import llama_cpp.llama_cpp as bindings

    default_params = bindings.llama_model_default_params

    def params() -> bindings.llama_model_params:
        value = default_params()
        value.use_extra_bufts = False
        return value

    # llama_cpp.Llama looks this function up on the module at load time, so replacing it is enough.
    bindings.llama_model_default_params = params


def _last_row_logits() -> None:
    import llama_cpp.llama as llama
    import numpy as np

    def evaluate(self: llama.Llama, tokens: Sequence[int]) -> None:
        """``Llama.eval`` (llama-cpp-python 0.3) computing and keeping only each batch's last logits row."""
        self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        for start in range(0, len(tokens), self.n_batch):
            batch = tokens[start : min(len(tokens), start + self.n_batch)]
            n_past, n_tokens = self.n_tokens, len(batch)
            self._batch.set_batch(batch=batch, n_past=n_past, logits_all=False)
            self._ctx.decode(self._batch)
            self.input_ids[n_past : n_past + n_tokens] = batch
            if self._logits_all:  # else ``scores`` has n_batch rows and nothing reads it
                last = np.ctypeslib.as_array(self._ctx.get_logits_ith(-1), shape=(self._n_vocab,))
                self.scores[n_past + n_tokens - 1, :] = last
            self.n_tokens += n_tokens
            self._requires_eval = False

    llama.Llama.eval = evaluate  # type: ignore[method-assign]


def _serve(settings_json: bytes) -> None:
    """llama_cpp.server's ``__main__`` for settings given as JSON, with :class:`Guard` in front."""
    import uvicorn
    from llama_cpp.server import app as llama_app
    from llama_cpp.server.settings import ConfigFileSettings, ServerSettings

    config = ConfigFileSettings.model_validate_json(settings_json)
    server_settings = ServerSettings.model_validate(config)
    stats = Stats()
    stop_when_client_leaves(stats)
    streams_end_their_generation()
    template_errors_are_client_errors()
    unparsable_grammars_are_errors()
    openai_client_errors()
    app = llama_app.create_app(server_settings=server_settings, model_settings=config.models)
    proxy = llama_app._llama_proxy
    assert proxy is not None
    model = config.models[0].model_alias or config.models[0].model
    guarded = Guard(app, stats, model, proxy().n_vocab(), error_mapper())
    uvicorn.run(guarded, host=server_settings.host, port=server_settings.port)


def main() -> None:
    _die_with_parent()
    _plain_cpu_buffers()
    _last_row_logits()
    _settings_from_parent_only()
    settings = sys.stdin.buffer.read()
    sys.argv[0] = "llama_cpp.server"
    _serve(settings)


if __name__ == "__main__":
    main()
