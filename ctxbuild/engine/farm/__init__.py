"""Remote execution on a Dask cluster, with the content-addressed cache as the data plane.

ninja still decides what runs. An action process (runner.py) that misses the cache uploads its input
blobs to the remote cache and asks the driver's gateway (gateway.py, the one dask Client of the build) to
run it; a Dask worker (task.py) fetches the blobs by digest into a private scratch directory, runs the
very same runner there and uploads outputs + record through the cache; the action process then restores
them like any cache hit. Only small JSON requests and replies travel through the Dask scheduler.
"""
