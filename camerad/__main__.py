import sys
from camerad.main import main

sys.exit(main())
