import sys
from batch.main import main

sys.exit(main())
