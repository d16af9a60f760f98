#!/usr/bin/env bash
# Starts, stops and demonstrates a local ferrymq cluster. The servers and the
# admin CLI are not built yet (issue #7); until they are, say so and fail.
set -euo pipefail
echo "ferrymq: the local cluster needs cmd/ferry-metaserver, cmd/ferry-broker and ferryctl, which are not built yet (issue #7)." >&2
exit 2
