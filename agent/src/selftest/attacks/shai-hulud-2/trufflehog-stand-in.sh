#!/bin/sh
# credwatch selftest: a stand-in for the TruffleHog Shai-Hulud 2.0 downloaded to scan $HOME; it
# scans nothing and reports one made-up finding.
echo '{"DetectorName":"credwatch-selftest","Raw":"FAKE-credwatch-selftest-not-a-secret"}'
