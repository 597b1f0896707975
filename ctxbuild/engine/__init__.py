"""The driver: plan (re)use, ninja (render, quote, log), console, restore, worker/client, runner, OUT placement."""
