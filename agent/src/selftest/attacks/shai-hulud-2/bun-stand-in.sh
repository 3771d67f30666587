#!/bin/sh
# credwatch selftest: a stand-in for the Bun runtime Shai-Hulud 2.0 downloaded; it runs the payload
# with node.
exec node "$@"
