import sys
from modeld_batch.main import main

sys.exit(main())
