"""A bucket decode's GPU time with its length mask as a whole-input multiply or an in-place tail.

`python -m bench.decode_mask_ab --checkpoint ckpt-full --out decmask.json` (CUDA): the codec's
bucket graphs (`server/engine/model/decode_graphs.py`) captured twice on one stream, once with
`LengthMask.in_place` off (every convolution's input multiplied whole by the mask into a new
tensor) and once on (only the part past the bucket's fewest frames zeroed in place); for clips
of 50, 250 and 375 frames, the median GPU milliseconds of 20 replays each, and whether the two
give the same audio bit for bit.
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.forward import cuda_ms

FRAMES = (50, 250, 375)


def run(checkpoint: str) -> dict:
    from server.checkpoint import load_omnivoice
    from server.engine.model import decode_graphs as dg
    from server.engine.model.codec import Codec

    model = load_omnivoice(checkpoint, "cuda", "bfloat16")
    codec = Codec(model)  # the codec's Snake kernels; its own graphs' hooks come off
    for handle in codec.graphs.mask.handles:
        handle.remove()
    decoder = model.audio_tokenizer.acoustic_decoder
    gen = torch.Generator().manual_seed(0)
    clips = {f: torch.randint(0, 1024, (1, model.config.num_audio_codebook, f), generator=gen).cuda()
             for f in FRAMES}
    stream = torch.cuda.Stream()
    out: dict = {}
    audio = {}
    for in_place in (False, True):
        graphs = dg.DecodeGraphs(codec._decode_codes, decoder)
        graphs.mask.in_place = in_place
        times = {}
        with torch.cuda.stream(stream), torch.inference_mode():
            for f, codes in clips.items():
                # three warm-up calls (eager, capture, replay), then 20 timed replays
                times[f] = round(cuda_ms(lambda codes=codes: graphs.decode(codes), warmup=3, iters=20)["median"], 3)
                audio[(in_place, f)] = graphs.decode(codes).float().cpu().clone()
        for handle in graphs.mask.handles:
            handle.remove()
        out["in_place" if in_place else "multiply"] = times
    out["bit_equal"] = {f: bool(torch.equal(audio[(False, f)], audio[(True, f)])) for f in FRAMES}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.decode_mask_ab", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m bench.decode_mask_ab needs a CUDA GPU")
        return 2
    torch.set_grad_enabled(False)
    result = run(args.checkpoint)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
