#!/bin/sh
# credwatch selftest: a stand-in for a tool a real payload ran (gh, claude, gemini, q, sudo). It runs
# nothing real: `gh auth token` prints the token of the throwaway home's hosts.yml, as gh does; the
# others only say what they were asked.
name=${0##*/}
if [ "$name" = gh ] && [ "$1" = auth ] && [ "$2" = token ]; then
    sed -n 's/^ *oauth_token: *//p' "$HOME/.config/gh/hosts.yml"
    exit 0
fi
echo "credwatch selftest: a stand-in for $name; it did nothing"
