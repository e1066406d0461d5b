"""Build the neural swap stages from the configuration and the model zoo."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..config import Config
from ..engines.download import ModelStore
from ..engines.errors import EngineUserError, ModelMissingError
from ..engines.runner import Runner
from ..engines.select import make_runner
from ..engines.zoo import TEMPLATES, ModelSpec, get_spec
from .analyser import DetectorAnalyser
from .face_stack import FaceEnhancer, FaceMasker, region_classes
from .swapper import Embedder, NeuralSwapper, SwapContract

log = logging.getLogger(__name__)

ConfirmFn = Callable[[str], bool]


def contract_of(spec: ModelSpec) -> SwapContract:
    """The swap contract of a zoo swapper, or a clear error for the ones not supported yet."""
    if spec.kind != "swapper":
        raise EngineUserError(f"'{spec.name}' is a {spec.kind}, not a swapper")
    if spec.source_input != "embedding":
        raise EngineUserError(f"'{spec.name}' takes a source image rather than an embedding; "
                              f"that contract is not supported yet: use inswapper_128, "
                              f"hyperswap_1a_256 or simswap_256")
    if spec.template is None or spec.size is None:
        raise EngineUserError(f"zoo entry '{spec.name}' has no template or size")
    if spec.embedding == "emap":
        kind = "emap"
    elif spec.embedding_l2:
        kind = "normalized"
    else:
        kind = "raw"
    return SwapContract(size=spec.size, template=TEMPLATES[spec.template], mean=spec.mean,
                        std=spec.std, embedding=kind,  # type: ignore[arg-type]
                        output_range="std_mean" if spec.output_range == "std_mean" else "0_1_clip")


class NeuralStages:
    """The runners, analyser and swapper of one neural configuration; close() frees them."""

    def __init__(self, cfg: Config, *, models_dir: Path | None = None,
                 confirm: ConfirmFn | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 builtin_tracking: bool = False) -> None:
        """`builtin_tracking`: the caller tracks the faces with the built-in analyser whatever
        `neural.detector` says (the runtime's streams), so its faces carry the mesh an `area` mask
        needs."""
        self.cfg = cfg
        check_tracking(cfg, builtin_tracking)
        self.store = ModelStore(models_dir or cfg.models_dir)
        # Every model first (downloaded where missing): `model_names` is the one list of them, which
        # a command's `fetch_models` walks too.
        self._paths = {n: _fetch(cfg, self.store, n, confirm, progress) for n in model_names(cfg)}
        self._runners: list[Runner] = []
        nc = cfg.neural
        spec = get_spec(cfg.swapper)
        contract = contract_of(spec)
        swap_path = self._model(spec.name)
        runner = self._runner(swap_path)
        emb_spec = get_spec(nc.embedder)
        embedder = Embedder(self._runner(self._model(emb_spec.name)),
                            TEMPLATES[emb_spec.template or "arcface_112_v2"], emb_spec.size or 112)
        emap = None
        if contract.embedding == "emap":
            import onnx

            from ..engines.torch_models import emap_of

            emap = emap_of(onnx.load(str(swap_path)))
        converter = None
        if spec.converter:
            converter = self._runner(self._model(spec.converter))
        self.masker = self._masker()
        # Without `box` in mask.types FaceFusion pastes with the model masks alone: blur 0 leaves
        # the paste-back's box a hard one-pixel frame, the nearest our single paste kernel comes.
        blur = nc.blur if "box" in cfg.mask.types else 0.0
        self.enhancer: FaceEnhancer | None = None
        if cfg.enhancer != "none":
            enh = get_spec(cfg.enhancer)
            self.enhancer = FaceEnhancer(self._runner(self._model(enh.name)), enh,
                                         TEMPLATES[enh.template or "ffhq_512"], blend=cfg.enhancer_blend)
        self.swapper = NeuralSwapper(contract, runner, embedder, emap=emap, converter=converter,
                                     max_batch=nc.max_batch, blur=blur, masker=self.masker,
                                     enhancer=self.enhancer)
        self.analyser: DetectorAnalyser | None = None
        if nc.detector != "builtin":
            self.analyser = _detector(cfg, self._runner(self._model(get_spec(nc.detector).name)))

    def _masker(self) -> FaceMasker | None:
        """The occlusion and region models that `mask.types` asks for, or None for `box` alone."""
        mc = self.cfg.mask
        kw: dict[str, object] = {}
        if "area" in mc.types:
            if not mc.areas:
                raise EngineUserError("mask.types has 'area' but mask.areas is empty: name the areas the "
                                      "swap may paint, e.g. --set mask.areas=upper-face,lower-face,mouth")
            kw["areas"] = tuple(mc.areas)
        if "occlusion" in mc.types:
            kw["occluder_spec"] = get_spec(mc.occluder)
            kw["occluder"] = self._runner(self._model(mc.occluder))
        if "region" in mc.types:
            if not mc.regions:
                raise EngineUserError("mask.types has 'region' but mask.regions is empty: name the "
                                      "parts the swap may paint, e.g. --set mask.regions=skin,nose,mouth")
            kw["parser_spec"] = get_spec(mc.parser)
            kw["parser"] = self._runner(self._model(mc.parser))
            kw["regions"] = region_classes(mc.regions)
        return FaceMasker(**kw) if kw else None  # type: ignore[arg-type]

    def _model(self, name: str) -> Path:
        return self._paths[name]

    def _runner(self, path: Path) -> Runner:
        runner = _runner(self.cfg, path)
        self._runners.append(runner)
        return runner

    def close(self) -> None:
        for r in self._runners:
            r.deactivate()
        self._runners.clear()


def _fetch(cfg: Config, store: ModelStore, name: str, confirm: ConfirmFn | None,
           progress: Callable[[str, int, int], None] | None) -> Path:
    """The file of zoo model `name`, downloaded first when it is missing and downloads are on."""
    try:
        return store.path(name)
    except ModelMissingError:
        if not cfg.neural.download:
            raise
    log.info("downloading %s", name)
    report = None
    if progress is not None:
        report = lambda done, total: progress(name, done, total)  # noqa: E731
    return store.download(name, accept_licence=cfg.neural.accept_licence, confirm=confirm, progress=report)


def _runner(cfg: Config, path: Path) -> Runner:
    nc = cfg.neural
    runner = make_runner(path, nc.runner, precision=nc.precision, compile=nc.compile)
    if hasattr(runner, "finite_check"):  # the torch runner's fp16 overflow guard
        # Validated by the config's Literal type ("sync" or "deferred").
        runner.finite_check = nc.finite_check  # type: ignore[attr-defined]
    runner.activate()
    return runner


def model_names(cfg: Config) -> list[str]:
    """The zoo models that `NeuralStages(cfg)` loads."""
    nc, mc = cfg.neural, cfg.mask
    spec = get_spec(cfg.swapper)
    names = [spec.name, get_spec(nc.embedder).name]
    names += [spec.converter] if spec.converter else []
    names += [mc.occluder] if "occlusion" in mc.types else []
    names += [mc.parser] if "region" in mc.types else []
    names += [get_spec(cfg.enhancer).name] if cfg.enhancer != "none" else []
    names += [get_spec(nc.detector).name] if nc.detector != "builtin" else []
    return names


def fetch_models(cfg: Config, *, confirm: ConfirmFn | None = None,
                 progress: Callable[[str, int, int], None] | None = None) -> None:
    """Download the models `cfg`'s neural stages need that are missing, asking for their licences
    through `confirm`. A command does this before its runtime starts: the runtime builds the stages
    in its device thread, where nobody can be asked."""
    store = ModelStore(cfg.models_dir)
    for name in model_names(cfg):
        _fetch(cfg, store, name, confirm, progress)


def check_tracking(cfg: Config, builtin_tracking: bool = False) -> None:
    """An `area` mask reads the face mesh of the built-in analyser: refused where a zoo detector
    tracks the faces (`neural.detector`), unless the caller tracks with the built-in one anyway."""
    det = cfg.neural.detector
    if "area" in cfg.mask.types and det != "builtin" and not builtin_tracking:
        raise EngineUserError(f"mask.types 'area' takes its landmarks from the built-in analyser's face mesh, "
                              f"and neural.detector is '{det}': use --set neural.detector=builtin, or leave "
                              f"'area' out")


def _detector(cfg: Config, runner: Runner) -> DetectorAnalyser:
    nc = cfg.neural
    det = get_spec(nc.detector)
    return DetectorAnalyser(runner, det.detector_family or "scrfd", det.size or 640, min_score=nc.min_score,
                            detect_every=nc.detect_every, max_faces=cfg.detector.max_faces)


def detector_analyser(cfg: Config) -> DetectorAnalyser:
    """The zoo detector of `neural.detector`, tracking faces: a stream's own analyser (runtime.stream)."""
    return _detector(cfg, _runner(cfg, ModelStore(cfg.models_dir).path(get_spec(cfg.neural.detector).name)))
