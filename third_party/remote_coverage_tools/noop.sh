#!/bin/sh
# Coverage is not collected in this offline build; this stub satisfies bazel_tools.
exit 0
