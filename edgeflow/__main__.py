from edgeflow.cli import main

raise SystemExit(main())
