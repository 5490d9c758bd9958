"""Where the time of a preset's `serving_default` goes: each part against its FLOP bound.

    python bench/serving_parts.py --images=GLOB [--preset=flickr8k_lite0_grid14_soft]
        [--count=32] [--repeats=3] [--output=PATH]

Builds the captioner of the preset in this process (`Captioner.from_preset`) and times,
on the first `--count` photos in batches of 1 and of 16, each part of the export's image
path: admission (`graph_admission.decode_images_admitted` on the bytes, in a
`tf.function`), the encoder (`Captioner._features` on those pixels), decoding
(`inference.make_caption_fn` on those features: `model.generate` with the preset's tags,
greedy and beam 3), and the whole (the `serving_default` signature of an export written
here by `exporting.export` and loaded with `tf.saved_model.load`, greedy and beam 3).
Each takes the median of `--repeats` passes over all the photos after one warm-up pass;
the parts run in turns, so a loaded machine slows them alike.

FLOPs: the encoder's per photo counted from its Keras layers (`flops.encoder_flops`:
Conv2D 2 H W Cout k^2 Cin, DepthwiseConv2D 2 H W C k^2; batch norms, activations,
additions, biases and the preprocessing are not counted), split into 1x1 convolutions,
other convolutions and depthwise ones. The decoder's per image and per hypothesis-step
(`flops.decode_flops`, with the tagger's ImageNet head and tag sums per image) times the
hypothesis-steps decoding runs: the rows each call of the decoder's step is given,
summed in a counting copy of the decoding run once on the same features. Beam
bookkeeping (top-k, blocking, gathers) is not counted; admission, the off-world score
and the word lookup count 0. The yardstick is the float32 2048 x 2048 by 2048 x 2048
matmul in a `tf.function`, best of `--matmul_tries`, measured in this run.

Prints one JSON object: the machine, the settings, the counts, and per part, batch and
decoding the seconds a batch, the FLOPs a batch, GFLOP/s, its share of the matmul rate,
and its share of the whole's time; `--output` also writes it there. The photos of the
Flickr8k copy are 224 x 224 (its README). Never run as a test.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from unittest import mock

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "bench")]

BATCHES = (1, 16)
DECODINGS = {"greedy": 1, "beam3": 3}


def _matmul_gflops(tries, size=2048):
    """The best GFLOP/s of a float32 (size, size) x (size, size) product."""
    import tensorflow as tf

    a = tf.random.stateless_normal([size, size], seed=[0, 1])
    b = tf.random.stateless_normal([size, size], seed=[0, 2])
    product = tf.function(lambda a, b: tf.reduce_sum(tf.matmul(a, b)))
    product(a, b).numpy()
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        product(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def _hypothesis_steps(make_fn, batch_lists):
    """For each list of batches, the rows the decoder's step is given over them, summed
    in the graph by a copy of the decoding (`make_fn()`) whose step adds them to a
    counter."""
    import tensorflow as tf

    from sat_tf.model.show_attend_tell import ShowAttendTell

    counter = tf.Variable(0, dtype=tf.int64, trainable=False)
    decoding_step = ShowAttendTell.decoding_step

    def counting_step(self, hard_decoding=None):
        step = decoding_step(self, hard_decoding)

        def counted(tokens, state, *constants):
            added = counter.assign_add(tf.cast(tf.shape(tokens)[0], tf.int64))
            with tf.control_dependencies([added]):
                tokens = tf.identity(tokens)
            return step(tokens, state, *constants)

        return counted

    counts = []
    with mock.patch.object(ShowAttendTell, "decoding_step", counting_step):
        fn = make_fn()  # traced, for every batch shape, with the counting step
        for batches in batch_lists:
            counter.assign(0)
            for batch in batches:
                fn(batch)
            counts.append(int(counter.numpy()))
    return counts


def _timed(jobs, repeats):
    """{name: median seconds of a pass over its batches} of (name, fn, batches) jobs,
    warmed up first, then run in turns."""
    for _, fn, batches in jobs:
        for batch in batches:
            fn(batch)
    times = {name: [] for name, _, _ in jobs}
    for _ in range(repeats):
        for name, fn, batches in jobs:
            start = time.perf_counter()
            for batch in batches:
                fn(batch)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", required=True)
    parser.add_argument("--preset", default="flickr8k_lite0_grid14_soft")
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matmul_tries", type=int, default=5)
    parser.add_argument("--output", default="")
    args = parser.parse_args()

    import flops
    import serving_speed
    import tensorflow as tf

    from sat_tf import Captioner
    from sat_tf.data import graph_admission
    from sat_tf.serving import exporting, inference
    from sat_tf.utils import machine

    data = serving_speed.photo_bytes(args.images, args.count)
    captioner = Captioner.from_preset(args.preset)
    model, config, vocab = captioner.model, captioner.config, captioner.vocab
    decoder = model.decoder
    if decoder.global_context:
        raise SystemExit("bench/flops.py's Shape has no global context; this decoder has one")

    size, crop = config.image_size, captioner.crop_fraction
    admit = tf.function(
        lambda b: graph_admission.decode_images_admitted(b, size, crop)[0], autograph=False
    )
    encode = tf.function(captioner._features, autograph=False)
    pixels = admit(tf.constant(data))
    features = encode(pixels)

    def split(x, batch):
        return [x[i : i + batch] for i in range(0, len(data), batch)]

    with tempfile.TemporaryDirectory() as folder:
        serving = {}
        for name, beam_size in DECODINGS.items():
            directory = os.path.join(folder, name)
            exporting.export(
                model, vocab, config, directory, beam_size=beam_size, off_world=captioner.off_world
            )
            serving[name] = tf.saved_model.load(directory).signatures["serving_default"]
        feature_batches = {
            batch: [{"features": f} for f in split(features, batch)] for batch in BATCHES
        }
        jobs, steps = [], {}
        for batch in BATCHES:
            photos = split(tf.constant(data), batch)
            jobs.append((f"admission/{batch}", admit, photos))
            jobs.append((f"encoder/{batch}", encode, split(pixels, batch)))
        for name, beam_size in DECODINGS.items():

            def make_fn(beam_size=beam_size):
                return inference.make_caption_fn(model, config, beam_size, vocab=vocab)

            counts = _hypothesis_steps(make_fn, [feature_batches[b] for b in BATCHES])
            fn, whole = make_fn(), serving[name]
            for batch, count in zip(BATCHES, counts, strict=True):
                steps[f"{batch}/{name}"] = count
                jobs.append((f"decoding/{batch}/{name}", fn, feature_batches[batch]))
                photos = split(tf.constant(data), batch)
                jobs.append((f"whole/{batch}/{name}", lambda b, f=whole: f(image_bytes=b), photos))
        matmul_before = _matmul_gflops(args.matmul_tries)
        seconds = _timed(jobs, args.repeats)
        matmul = max(matmul_before, _matmul_gflops(args.matmul_tries))

    shape = flops.Shape(
        locations=int(features.shape[1]),
        feature_dim=int(features.shape[2]),
        embed_dim=decoder.embed_dim,
        hidden_dim=decoder.hidden_dim,
        attention_dim=decoder.attention_dim,
        vocab_size=decoder.vocab_size,
        attention=decoder.attention,
        score=decoder.attention_score,
        hard_gate=decoder.hard_gate,
    )
    encoder = flops.encoder_flops(inference.feature_encoder(model, config).net)
    decoding = flops.decode_flops(shape)
    per_image = decoding["per_image"]
    tagger = model.tagger if config.tags else None
    if tagger is not None:
        per_image += 2 * tagger.kernel.size + 2 * tagger.to_tags.size
    count = len(data)
    work = {"admission": 0, "encoder": count * encoder["total"]}

    def part(name, batch, flop_count, whole_seconds):
        calls = -(-count // batch)
        elapsed = seconds[name]
        rate = flop_count / elapsed / 1e9
        return {
            "seconds": round(elapsed / calls, 4),
            "flops": round(flop_count / calls),
            "gflop_per_s": round(rate, 2),
            "share_of_matmul_rate": round(rate / matmul, 4),
            "share_of_whole": round(elapsed / whole_seconds, 3),
        }

    parts = {}
    for batch in BATCHES:
        for name, _ in DECODINGS.items():
            hypothesis_steps = steps[f"{batch}/{name}"]
            decode_work = count * per_image + hypothesis_steps * decoding["step"]
            whole = seconds[f"whole/{batch}/{name}"]
            entry = {
                key: part(f"{key}/{batch}", batch, work[key], whole)
                for key in ("admission", "encoder")
            }
            entry["decoding"] = part(f"decoding/{batch}/{name}", batch, decode_work, whole)
            entry["decoding"]["hypothesis_steps_per_photo"] = round(hypothesis_steps / count, 2)
            entry["whole"] = part(
                f"whole/{batch}/{name}", batch, work["encoder"] + decode_work, whole
            )
            entry["whole"]["photos_per_s"] = round(count / whole, 2)
            parts.setdefault(str(batch), {})[name] = entry
    report = {
        "machine": machine.describe(),
        "preset": args.preset,
        "photos": count,
        "repeats": args.repeats,
        "tags": tagger is not None,
        "matmul_gflop_per_s": round(matmul, 2),
        "encoder_flops_per_photo": encoder,
        "decoder_flops": {**decoding, "per_image_with_tagger": per_image},
        "parts": parts,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
