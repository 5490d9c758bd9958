"""Captioning without TensorFlow: a trained captioner's TFLite file run in LiteRT
(docs/design.md §7.3).

`LiteRTCaptioner` captions as `sat_tf.serving.api.Captioner` does, with the same
`Caption`s (fields, words, scores and attention within float rounding of TensorFlow's):
the images go through `image_pixels` (TensorFlow's pixels in NumPy), the file
(`sat_tf.serving.tflite`: the encoder, the preset's own beam search with its tags, the
off-world score) runs in LiteRT's interpreter, one per core for a batch. Nothing it
imports loads TensorFlow, tensorflow-text or Keras; what it cannot do (another decoding
than the file's, more captions than its beam, `attend`, the model itself) it hands to a
TensorFlow captioner of the same model, loaded the first time one is asked for.

Which runtime captions (`choose`): `tensorflow` when asked or when the request needs
it; `litert` when asked (the file built first if the cache lacks it); `auto` takes
LiteRT when the packages are installed and the file of this model and decoding is in
the cache, or, where `build` allows, when the model is a shipped or downloaded preset
captioning with its own decoding (its file is built once, on first use), else
TensorFlow. A preset folder or a workdir can change under its name, so `auto` builds
no file for them: `--runtime=litert` does.
"""

import concurrent.futures
import contextlib
import functools
import importlib.util
import os
import queue
from typing import NamedTuple

import numpy as np

from sat_tf.config import RUNTIMES, Config
from sat_tf.data import image_pixels
from sat_tf.data.image_files import MAX_IMAGE_PIXELS
from sat_tf.evaluation import visualize
from sat_tf.serving import captions as captions_lib
from sat_tf.serving import litert_cache, off_world_stats, preset
from sat_tf.serving.captions import Caption
from sat_tf.utils import quiet

# Importable name -> the package that installs it.
PACKAGES = {"ai_edge_litert": "ai-edge-litert", "simplejpeg": "simplejpeg"}


def missing_packages() -> list[str]:
    """The packages LiteRT captioning needs that are not installed."""
    return [name for module, name in PACKAGES.items() if importlib.util.find_spec(module) is None]


class Source(NamedTuple):
    """A trained captioner as the runtimes see it before loading it.

    Attributes:
      kind: "preset" or "workdir".
      directory: its folder.
      config: its config, with the decoding it captions with.
      fixed: a shipped or downloaded preset, which cannot change under its name.
    """

    kind: str
    directory: str
    config: Config
    fixed: bool


def read_source(kind: str, source: str, cache_dir: str | None = None) -> Source:
    """The `Source` of a preset (a shipped name, a folder, an https:// URL, downloaded
    into the cache) or a workdir, without TensorFlow.

    Raises:
      ValueError: for a preset or workdir that is not there.
    """
    if kind == "workdir":
        directory, fixed = source, False
        missing = f"{directory} is not a sat_tf workdir: {preset.CONFIG_FILE} is missing"
    else:
        directory = preset.resolve(source, cache_dir)
        fixed = "://" in source or source in preset.names()
        preset.read_metadata(directory)  # its messages, as `preset.read` gives them
        missing = f"preset {directory}: {preset.CONFIG_FILE} is missing"
    path = os.path.join(directory, preset.CONFIG_FILE)
    if not os.path.isfile(path):
        raise ValueError(missing)
    return Source(kind, directory, Config.load(path), fixed)


def choose(runtime, source, own_decoding=True, needs="", build=True, cache_dir=None):
    """Which runtime captions, and the LiteRT file's folder where it is built.

    Args:
      runtime: one of `RUNTIMES`.
      source: the `Source`, its config with the decoding asked for.
      own_decoding: whether that decoding is the model's own (no flag changed it).
      needs: what of the request only TensorFlow does ("--sample" ...), or "".
      build: whether `auto` may build the file of a fixed preset (the command does, the
        Python API uses files already built).
      cache_dir: None for `files.cache_dir()`.

    Returns:
      ("tensorflow", None, why) or ("litert", the folder or None where it is to be
      built, why): why is a line to tell the user ("" for nothing worth saying).

    Raises:
      ValueError: for `litert` with a request it cannot serve or without its packages.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"--runtime={runtime!r} is not one of {', '.join(RUNTIMES)}")
    if runtime == "tensorflow":
        return "tensorflow", None, ""
    if needs:
        if runtime == "litert":
            raise ValueError(f"{needs} needs TensorFlow: leave out --runtime=litert")
        return "tensorflow", None, ""
    missing = missing_packages()
    if missing:
        install = f"pip install {' '.join(missing)}"
        if runtime == "litert":
            raise ValueError(f"--runtime=litert needs {', '.join(missing)}: {install}")
        return (
            "tensorflow",
            None,
            f"captioning with TensorFlow: LiteRT is not installed ({install})",
        )
    key = litert_cache.fingerprint(source.kind, source.directory, source.config)
    folder = litert_cache.find(key, cache_dir)
    if folder or runtime == "litert" or (build and source.fixed and own_decoding):
        return "litert", folder, ""
    return "tensorflow", None, ""


class LiteRTCaptioner:
    """Captions images with a built TFLite file (`litert_cache`) in LiteRT.

    Args:
      folder: the file's folder (`litert_cache.build`).
      batch_size: images per call of `caption_pixels` (the images of one call run on
        one interpreter per core).
      max_image_pixels: the most pixels (width x height) a file or bytes may declare.
      tensorflow: a function returning a TensorFlow `api.Captioner` of the same model
        and decoding, for what LiteRT does not do; None: those requests fail.
      threads: interpreters for a batch; None: one per core.
    """

    runtime = "litert"
    # Whether an interpreter of this process has run (LiteRT logs its delegate once).
    _ran = False

    def __init__(
        self,
        folder,
        batch_size=16,
        max_image_pixels=MAX_IMAGE_PIXELS,
        tensorflow=None,
        threads=None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        if max_image_pixels < 1:
            raise ValueError(f"max_image_pixels={max_image_pixels} must be at least 1")
        self.info = litert_cache.read_info(folder)
        litert_cache.touch(folder)
        self.path = os.path.join(folder, self.info["tflite"]["file"])
        self.batch_size, self.max_image_pixels = batch_size, max_image_pixels
        self.image_size = self.info["image_size"]
        self.crop_fraction = self.info["crop_fraction"]
        self.grid = tuple(self.info["grid"])
        self.beam_size = self.info["tflite"]["beam_size"]
        self.folder = folder
        self._make_tensorflow = tensorflow
        self._tensorflow_captioner = None
        self._threads = threads or os.cpu_count() or 1
        self._runners = queue.SimpleQueue()
        self._made = 0

    @functools.cached_property
    def off_world(self):
        """The model's `off_world_stats.Stats` (the threshold of a caption's off-world
        mark), None for a model without them."""
        path = os.path.join(self.folder, off_world_stats.FILE)
        return off_world_stats.load(path) if os.path.isfile(path) else None

    def _runner(self, alone):
        """An idle interpreter's signature runner (made when none is idle: with all the
        cores for an image captioned alone, one core each for a batch)."""
        try:
            return self._runners.get_nowait()
        except queue.Empty:
            from ai_edge_litert.interpreter import Interpreter

            threads = self._threads if alone else 1
            self._made += 1
            return Interpreter(model_path=self.path, num_threads=threads).get_signature_runner()

    def _run(self, image, alone):
        runner = self._runner(alone)
        try:
            return runner(image=image[None])
        finally:
            self._runners.put(runner)

    def _run_all(self, pixels):
        """The outputs of each image, on one interpreter per core for a batch. LiteRT's
        line about its CPU delegate, written at the first run of a process, is left out
        where `TF_CPP_MIN_LOG_LEVEL` asks (`quiet.info_hidden`)."""
        alone = len(pixels) == 1
        workers = 1 if alone else min(self._threads, len(pixels))
        silenced = quiet.info_hidden() and not LiteRTCaptioner._ran
        with quiet.stderr_silenced() if silenced else contextlib.nullcontext():
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                outputs = list(pool.map(lambda image: self._run(image, alone), pixels))
        LiteRTCaptioner._ran = True
        return outputs

    def _tensorflow(self):
        if self._tensorflow_captioner is None:
            if self._make_tensorflow is None:
                raise ValueError("this LiteRT captioner has no TensorFlow captioner to hand to")
            self._tensorflow_captioner = self._make_tensorflow()
        return self._tensorflow_captioner

    def __getattr__(self, name):
        """What LiteRT does not hold (the model, its vocabulary and config, `attend`):
        the TensorFlow captioner's."""
        if name.startswith("_") or name in ("info", "folder"):  # never its own, nor half-made
            raise AttributeError(name)
        return getattr(self._tensorflow(), name)

    def load_image(self, image, index: int = 0) -> np.ndarray:
        """`api.Captioner.load_image` without TensorFlow: (S, S, 3) float32 pixels."""
        return captions_lib.pixels(
            image, index, self.image_size, self.crop_fraction, self.max_image_pixels, image_pixels
        )

    def _serves(self, beam_size, num_captions):
        return beam_size in (None, self.beam_size) and 1 <= num_captions <= self.beam_size

    def caption_pixels(self, pixels, beam_size=None, num_captions=1) -> list:
        """`api.Captioner.caption_pixels`: one `Caption` per image, or with
        `num_captions` > 1 a list of that many per image, best first (the beam's finished
        hypotheses; fewer where the beam held fewer).

        Args:
          pixels: (N, S, S, 3) float pixels in [0, 255].
          beam_size: None or the file's beam (another goes to TensorFlow).
          num_captions: captions per image; more than the file's beam go to TensorFlow.
        """
        if beam_size is not None and beam_size < 1:
            raise ValueError(f"beam_size={beam_size} must be at least 1 (None: the model's)")
        if not self._serves(beam_size, num_captions):
            extra = {} if num_captions == 1 else {"num_captions": num_captions}
            return self._tensorflow().caption_pixels(pixels, beam_size, **extra)
        pixels = np.asarray(pixels, np.float32)
        size = self.image_size
        if pixels.ndim != 4 or pixels.shape[1:] != (size, size, 3):
            raise ValueError(f"pixels must be (N, {size}, {size}, 3); got {pixels.shape}")
        out = []
        for image, output in zip(pixels, self._run_all(pixels), strict=True):
            kept = self._captions(output, image)
            out.append(kept[:num_captions] if num_captions > 1 else kept[0])
        return out

    def _captions(self, output, image):
        """The `Caption`s of one image's outputs, best first; -inf hypotheses left out."""
        shown = np.clip(np.round(image), 0, 255).astype(np.uint8)
        common = {}
        if self.info["tagger"]:
            tag = output["tag_word"][0].decode("utf-8")
            common.update(tag=tag or None, tag_prob=float(output["tag_prob"][0]))
        threshold = self.info["off_world_threshold"]
        if threshold is not None:
            score = float(output["off_world_score"][0])
            common.update(off_world_score=score, off_world=score > threshold)
        found = []
        tokens = output["nbest_tokens"][0]  # (K, T)
        for j in range(tokens.shape[0]):
            log_prob = float(output["log_probs"][0][j])
            if j and not np.isfinite(log_prob):
                continue
            n = int(output["nbest_length"][0][j])
            words = [w.decode("utf-8") for w in output["nbest_words"][0][j][:n]]
            maps = output["nbest_attention"][0][j]  # (T, H, W)
            caption = Caption(
                text=" ".join(words),
                words=words,
                tokens=tokens[j][:n].astype(np.int32),
                score=log_prob,
                attention=maps[: min(n + 1, tokens.shape[1])],  # the words and `<end>`
                image=shown,
                **common,
            )
            found.append(caption)
        return found

    def caption(self, images, beam_size=None, num_captions=1, **options) -> list:
        """`api.Captioner.caption`: one image or a list, each as `load_image` takes it;
        `options` (sampling ...) and what `caption_pixels` hands on go to TensorFlow.

        Raises:
          ValueError: naming the first image that cannot be read, and why.
        """
        if options or not self._serves(beam_size, num_captions):
            extra = {} if num_captions == 1 else {"num_captions": num_captions}
            return self._tensorflow().caption(images, beam_size, **extra, **options)
        batch = list(images) if captions_lib.is_batch(images) else [images]
        pixels = [self.load_image(image, i) for i, image in enumerate(batch)]
        out = []
        for start in range(0, len(pixels), self.batch_size):
            chunk = np.stack(pixels[start : start + self.batch_size])
            out.extend(self.caption_pixels(chunk, beam_size, num_captions))
        return out

    def attention_figure(self, caption: Caption, path: str | None = None) -> np.ndarray:
        """`api.Captioner.attention_figure`: the image, then a panel per word."""
        alphas = caption.attention.reshape(len(caption.attention), -1)  # (M, L)
        shown, points = visualize.caption_panels(
            caption.words, alphas, self.info["decodes_at_a_cell"]
        )
        return visualize.attention_figure(
            caption.image, shown, alphas, self.grid, hard_points=points, path=path
        )

    def attention_summary(self, caption: Caption) -> str:
        """`api.Captioner.attention_summary`: where the model looked for each word."""
        alphas = caption.attention.reshape(len(caption.attention), -1)  # (M, L)
        shown, _ = visualize.caption_panels(caption.words, alphas, False)
        return visualize.attention_summary(shown, alphas, self.grid)


def from_source(
    kind: str,
    source: str,
    runtime: str = "auto",
    cache_dir: str | None = None,
    build: bool = False,
    tensorflow=None,
    **kwargs,
) -> LiteRTCaptioner | None:
    """The `LiteRTCaptioner` of a preset or workdir by `choose`'s rule (building its
    file if it chose so), or None where TensorFlow is to caption.

    Args:
      kind, source: "preset" and a name, folder or URL, or "workdir" and its folder.
      runtime: one of `RUNTIMES`.
      cache_dir: where downloads are kept; the files are built in `files.cache_dir()`.
      build: whether `auto` builds the file of a shipped or downloaded preset.
      tensorflow: a function of the `Source` and **kwargs returning what
        `LiteRTCaptioner(tensorflow=...)` takes (`api.tensorflow_loader`), or None.
      **kwargs: batch_size, max_image_pixels.
    """
    found = read_source(kind, source, cache_dir)
    chosen, folder, _ = choose(runtime, found, build=build)
    if chosen == "tensorflow":
        return None
    folder = folder or litert_cache.build(found.kind, found.directory, found.config)
    fallback = None if tensorflow is None else tensorflow(found, **kwargs)
    return LiteRTCaptioner(folder, tensorflow=fallback, **kwargs)
