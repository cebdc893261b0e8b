import sys
from modeld.main import main

sys.exit(main())
