"""Lung nodules: take lungs, vessels and a spec, give placed nodules; paint them and their mask."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from imaging_ai_devkit.phantom.canvas import Canvas, Planes
from imaging_ai_devkit.phantom.sdf import Arr, Bounds, Capsule, Coord, occupancy
from imaging_ai_devkit.phantom.spec import PhantomSpec
from imaging_ai_devkit.phantom.trees import PointSdf, Tree, segment_distance

SOLID, PART_SOLID, GROUND_GLASS, CALCIFIED = "solid", "part-solid", "ground-glass", "calcified"


@dataclass(frozen=True)
class Nodule:
    """One nodule: lobulated sphere of nominal ``diameter`` with optional spicules.

    Attributes
    ----------
    centre : tuple of float
        LPS position, mm.
    diameter : float
        Nominal (volume-equivalent before lobulation) diameter, mm.
    kind : str
        "solid", "part-solid", "ground-glass" or "calcified".
    hu : float
        Attenuation of the solid part (of the whole nodule for ground-glass).
    core : float
        Part-solid nodules: solid core diameter as a fraction of the whole.
    lobes : tuple
        ``(direction, amplitude, frequency, phase)`` surface harmonics.
    spicules : tuple of Capsule
        Thin strands radiating from the surface.
    """

    centre: tuple[float, float, float]
    diameter: float
    kind: str
    hu: float
    core: float
    lobes: tuple[tuple[tuple[float, float, float], float, float, float], ...]
    spicules: tuple[Capsule, ...]

    @property
    def reach(self) -> float:
        """Largest distance of any of its tissue from the centre, mm."""
        lobed = 0.5 * self.diameter * (1.0 + sum(abs(lobe[1]) for lobe in self.lobes))
        ends = [math.dist(s.b, self.centre) + s.rb for s in self.spicules]
        return max([lobed, *ends])

    @property
    def bounds(self) -> Bounds:
        """Box around all of its tissue."""
        c, r = self.centre, self.reach
        return (c[0] - r, c[0] + r, c[1] - r, c[1] + r, c[2] - r, c[2] + r)

    def sdf(self, x: Coord, y: Coord, z: Coord, shrink: float = 1.0) -> Arr:
        """Signed distance in mm; ``shrink`` < 1 gives the solid core of a part-solid nodule."""
        px, py, pz = x - self.centre[0], y - self.centre[1], z - self.centre[2]
        dist = np.sqrt(px * px + py * py + pz * pz)
        inv = 1.0 / np.maximum(dist, 1e-6)
        bump: Arr | float = 0.0
        for (ux, uy, uz), amp, freq, phase in self.lobes:
            bump = bump + amp * np.cos(freq * math.pi * (px * ux + py * uy + pz * uz) * inv + phase)
        d = dist - 0.5 * self.diameter * shrink * (1.0 + bump)
        if shrink == 1.0:
            for spicule in self.spicules:
                d = np.minimum(d, spicule.sdf(x, y, z))
        return np.asarray(d)


@dataclass(frozen=True)
class NodulePainter:
    """Paints nodules, clipped to the lungs, and records their mask occupancy."""

    nodules: tuple[Nodule, ...]

    def paint(self, canvas: Canvas, z: float, planes: Planes) -> None:
        """Paint every nodule the plane at ``z`` cuts."""
        for nod in self.nodules:
            win = canvas.shape_window(nod, z)
            if win is None:
                continue
            alpha = occupancy(nod.sdf(win.x, win.y, z), canvas.grid.spacing)
            alpha *= canvas.lung[win.index]
            np.maximum(canvas.nodule[win.index], alpha, out=canvas.nodule[win.index])
            hu = canvas.hu[win.index]
            tex = planes.fine[win.index]
            if nod.kind in (GROUND_GLASS, PART_SOLID):
                # Ground glass raises attenuation but leaves vessels inside it visible.
                glass = -610.0 + 45.0 * tex if nod.kind == PART_SOLID else nod.hu + 45.0 * tex
                hu += alpha * np.maximum(glass - hu, 0.0)
            if nod.kind == PART_SOLID:
                core = occupancy(nod.sdf(win.x, win.y, z, nod.core), canvas.grid.spacing)
                alpha = core * canvas.lung[win.index]
            if nod.kind != GROUND_GLASS:
                hu += alpha * (nod.hu + 12.0 * tex - hu)


def _kind(spec: PhantomSpec, diameter: float, rng: np.random.Generator) -> str:
    """Nodule type: mostly solid; sub-solid at the spec's rate; a few small ones calcified."""
    u = rng.random()
    if u < spec.subsolid_fraction:
        return PART_SOLID if rng.random() < 0.5 and diameter >= 8.0 else GROUND_GLASS
    return CALCIFIED if diameter < 10.0 and rng.random() < 0.06 else SOLID


def make_nodule(
    spec: PhantomSpec, centre: Arr, diameter: float, rng: np.random.Generator
) -> Nodule:
    """A nodule of ``diameter`` at ``centre`` with random type, lobulation and spicules."""
    kind = _kind(spec, diameter, rng)
    hu = {
        SOLID: spec.nodule_hu + rng.normal(0.0, 12.0),
        PART_SOLID: spec.nodule_hu + rng.normal(0.0, 10.0),
        GROUND_GLASS: rng.uniform(-700.0, -520.0),
        CALCIFIED: rng.uniform(250.0, 800.0),
    }[kind]
    lobes = []
    for _ in range(int(rng.integers(2, 6))):
        u = rng.normal(size=3)
        u /= np.linalg.norm(u)
        # Low harmonics only: a few broad lobes, not a cog wheel.
        amp = rng.uniform(0.02, 0.07) * (1.4 if diameter > 12 else 1.0)
        lobe = (float(u[0]), float(u[1]), float(u[2])), float(amp), float(rng.uniform(1.0, 3.0))
        lobes.append((*lobe, float(rng.uniform(0, 2 * math.pi))))
    spicules = []
    if kind == SOLID and diameter > 10.0 and rng.random() < 0.35:
        for _ in range(int(rng.integers(4, 10))):
            u = rng.normal(size=3)
            u /= np.linalg.norm(u)
            base = centre + u * 0.4 * diameter
            tip = centre + u * (0.5 * diameter + rng.uniform(3.0, 9.0))
            spicules.append(Capsule(_t(base), _t(tip), 0.9, 0.35))
    c = _t(centre)
    return Nodule(c, diameter, kind, float(hu), float(rng.uniform(0.35, 0.6)), tuple(lobes),
                  tuple(spicules))  # fmt: skip


def _t(v: Arr) -> tuple[float, float, float]:
    """Array of three to a tuple of floats."""
    return float(v[0]), float(v[1]), float(v[2])


def place_nodules(
    spec: PhantomSpec,
    lung_sdf: PointSdf,
    box: tuple[Arr, Arr],
    vessels: Tree,
    rng: np.random.Generator,
) -> tuple[Nodule, ...]:
    """Place ``spec.nodules`` nodules inside the lungs and inside ``box`` (the scanned slab).

    Centres are drawn until each nodule fits: clear of the pleura by its reach (or, for
    juxtapleural ones, touching it), of the larger vessels and of the other nodules. Diameters are
    log-uniform in the spec's range; when a slab is too thin for one, it is drawn again smaller.

    Raises
    ------
    ValueError
        If the lungs in the slab cannot hold the nodules.
    """
    lo_d, hi_d = spec.nodule_diameter_range_mm
    big = vessels.r > 1.2
    trunk = Tree(vessels.a[big], vessels.b[big], vessels.r[big], vessels.generation[big])
    placed: list[Nodule] = []
    for _ in range(spec.nodules):
        diameter = float(np.exp(rng.uniform(math.log(lo_d), math.log(hi_d))))
        for attempt in range(4000):
            shrink = 0.85 ** (attempt // 400)
            d = max(lo_d, diameter * shrink)
            nod = _try(spec, lung_sdf, box, trunk, placed, d, rng)
            if nod is not None:
                placed.append(nod)
                break
        else:
            raise ValueError(
                f"cannot fit {spec.nodules} nodules in the lungs of this slab; "
                "use more slices, thicker slices or fewer nodules"
            )
    return tuple(placed)


def _try(
    spec: PhantomSpec,
    lung_sdf: PointSdf,
    box: tuple[Arr, Arr],
    trunk: Tree,
    placed: list[Nodule],
    diameter: float,
    rng: np.random.Generator,
) -> Nodule | None:
    """One placement attempt; None if the candidate breaks a rule."""
    lo, hi = box
    r = diameter / 2
    margin = np.array([0.0, 0.0, r])
    if np.any(hi - lo <= 2 * margin):
        margin = np.zeros(3)
    c = lo + margin + (hi - lo - 2 * margin) * rng.random(3)
    nod = make_nodule(spec, c, diameter, rng)
    depth = -float(lung_sdf(c[None, 0], c[None, 1], c[None, 2])[0])
    juxta = rng.random() < spec.juxtapleural_fraction and nod.kind != CALCIFIED
    if juxta and not (0.45 * r <= depth <= 0.8 * r and not nod.spicules):
        return None
    if not juxta and depth < nod.reach + 1.5:
        return None
    if any(math.dist(c, o.centre) < r + o.reach + 3.0 for o in placed):
        return None
    if trunk.r.size and segment_distance(c[None, :], trunk)[0] < 0.6 * r:
        return None
    return nod
