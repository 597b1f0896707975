"""onnxruntime model packages (`package: true`, plan/packages.py)."""
from __future__ import annotations

from typing import Any, TypedDict

from ctxbuild.plan.kinds.base import Kind


class PackageVariantParams(TypedDict):
    package: str
    variant: str  # the variant directory: the target's name (+ the toolchain variant's suffix)


class PackageVariant(Kind):
    """One deliverable's files (wrappers and binary) copied into its variant directory of the recipe's model
    package, once its verifications passed."""
    name = "package_variant"
    implementation = "ctxbuild.actions.package_variant"
    params = PackageVariantParams
    package_part = True  # a package whose manifest was not made takes it aside (engine/finish.py)


class ModelPackageParams(TypedDict):
    name: str
    variants: list[dict[str, Any]]  # declaration order: component, variant, its wrapper's and verifications' input
    # roles, target, toolchain, shares_context (a weight-shared binary)


class ModelPackage(Kind):
    """manifest.json of an onnxruntime model package over a recipe's variant directories, written with
    onnxruntime's ModelPackage API and opened again with its reader."""
    name = "model_package"
    implementation = "ctxbuild.actions.model_package"
    params = ModelPackageParams
    deliverable = True  # listed in OUT/manifest.json (kind model_package, no target)
    verified_here = False  # its variants were verified before they were copied in: no verification note
