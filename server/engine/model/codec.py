"""The audio codec side: decode finished canvases, post-process, encode reference voices.

Each finished chunk is decoded on its own (a padded batch would change the samples near each
clip's end); on CUDA through Triton Snake activations and length-bucket CUDA graphs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from server.engine.kernels import snake
from server.engine.model import decode_graphs
from server.engine.model.decode_graphs import DecodeGraphs
from server.engine.model.postprocess import cross_fade_chunks, post_process_audio
from server.engine.reference import ReferenceModel
from server.engine.types import RequestRejected, VoicePrompt


class Codec:
    def __init__(self, model: ReferenceModel):
        self.model = model
        self.sample_rate: int = model.sampling_rate
        self.fused_snakes = 0  # Snake1d activations running as one Triton kernel each (CUDA only)
        self.graphs: DecodeGraphs | None = None  # decodes replayed as CUDA graphs (CUDA only)
        tokenizer = model.audio_tokenizer
        device = torch.device(tokenizer.device)
        if device.type == "cuda":
            self.fused_snakes = snake.install(tokenizer)
            if decode_graphs.wanted(device):
                self.graphs = DecodeGraphs(self._decode_codes, tokenizer.acoustic_decoder)

    def _decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return self.model.audio_tokenizer.decode(codes).audio_values

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, while_decoding: Callable[[], None] | None = None) -> np.ndarray:
        """(C, T) tokens -> (1, N) float32 waveform, as the reference decodes. On a GPU,
        `while_decoding` runs on this thread while the decode's kernels do."""
        codes = tokens.to(self.model.audio_tokenizer.device).unsqueeze(0)
        audio = (self.graphs.decode(codes) if self.graphs is not None else self._decode_codes(codes))[0]
        if while_decoding is not None and audio.is_cuda:
            while_decoding()
        return audio.float().cpu().numpy()  # copied out before this thread's next decode

    def replay(self, graphs, tokens: torch.Tensor) -> torch.Tensor | None:
        """Launch the decode of (C, T) device tokens on the current stream by replaying the
        graph of their length's bucket in `graphs` (one thread's set, `DecodeGraphs.mine()`):
        (channels, N) on the device, what `decode` copies out, valid until that set's next
        replay. None where the set has no graph for that length (`decode` then)."""
        if self.graphs is None:
            return None
        audio = self.graphs.replay(graphs, tokens.unsqueeze(0))
        return None if audio is None else audio[0]

    @torch.inference_mode()
    def encode_voice(self, audio: np.ndarray, sample_rate: int, text: str | None) -> VoicePrompt:
        """The reference's `create_voice_clone_prompt`: resample, RMS boost, silence trim,
        punctuation, codec encode."""
        if text is None and self.model._asr_pipe is None:
            raise RequestRejected(
                "text: a transcript is required (this server runs without an ASR model)", field="text"
            )
        waveform = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
        try:
            prompt = self.model.create_voice_clone_prompt((waveform, sample_rate), ref_text=text)
        except ValueError as exc:  # e.g. nothing left after silence removal
            raise RequestRejected(f"audio: {exc}", field="audio") from exc
        return VoicePrompt(tokens=prompt.ref_audio_tokens.detach().cpu(), text=prompt.ref_text,
                           rms=float(prompt.ref_rms))


# ---- plain functions: the reference's post-processing by its vectorised port ---------------


def post_process(audio: np.ndarray, ref_rms: float | None, postprocess: bool, sample_rate: int) -> np.ndarray:
    """The reference's `_post_process_audio` (default fade and pad), sample for sample, as (N,)."""
    out = post_process_audio(audio, ref_rms, postprocess, sample_rate)
    return np.ascontiguousarray(out.squeeze(0), dtype=np.float32)


def join_and_post_process(chunks: list[np.ndarray], ref_rms: float | None, postprocess: bool,
                          sample_rate: int) -> np.ndarray:
    return post_process(cross_fade_chunks(chunks, sample_rate), ref_rms, postprocess, sample_rate)
