"""The fast paths: plan only when recipes changed, reuse a plan for a fresh OUT, restore pending actions before
ninja starts, put back outputs edited in OUT, follow retargeted links."""
