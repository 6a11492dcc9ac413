import sys

try:
    from a3c_core.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command's own modules import
    print("\na3c: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
