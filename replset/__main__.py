from replset.cli import main

raise SystemExit(main())
