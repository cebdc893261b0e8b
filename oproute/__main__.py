import sys
from oproute.logreader import main

sys.exit(main())
