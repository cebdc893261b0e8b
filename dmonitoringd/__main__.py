import sys
from dmonitoringd.main import main

sys.exit(main())
