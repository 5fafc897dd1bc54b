"""Entry point of the embedded model's child process: llama-cpp-python's OpenAI server, hardened.

Run as a script by :class:`gateway.local_model.LocalModelServer` (``python -P <this file> --config_file
...``); the gateway imports only ``PARENT_PID_ENV`` from it. Before handing over to
``llama_cpp.server`` it does three things the stock server cannot be told to do:

* **Die with the parent.** ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux, so a gateway killed with
  SIGKILL (or OOM-killed) never leaves an orphaned model server holding memory and a port. Done here,
  after ``exec``, rather than in a ``preexec_fn``, which is unsafe in a threaded parent.
* **Settings from the config file only.** ``llama_cpp.server`` (pydantic-settings) fills every setting
  the config file leaves out from a same-named environment variable, case-insensitively: an unrelated
  ``API_KEY`` in the gateway's environment would make the child demand it, ``PORT``/``HOST`` would move
  it. Those variables are removed from the child's environment before the server reads it.
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
  numbers. (``echo`` with logprobs, which reads the prompt rows too, is not something the gateway
  sends.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

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


def _settings_from_config_file_only() -> None:
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


def main() -> None:
    _die_with_parent()
    _plain_cpu_buffers()
    _last_row_logits()
    _settings_from_config_file_only()
    from llama_cpp.server.__main__ import main as serve

    sys.argv[0] = "llama_cpp.server"
    serve()


if __name__ == "__main__":
    main()
