"""The driver: plan (re)use, ninja (render, quote, log, jobserver), restore, worker/client, runner, OUT placement."""
