"""What every openpilot model contract shares: the time and distance grids of its outputs, its run and context
rates, and the model frames the warps produce. What differs between releases (inputs, output heads, index maps) is
in modelrt.contracts.
"""
import numpy as np
from transformations.model import MODEL_WIDTH, MODEL_HEIGHT, DM_WIDTH, DM_HEIGHT

IDX_N = 33
T_IDXS = np.array([10.0 * (i / (IDX_N - 1)) ** 2 for i in range(IDX_N)], dtype=np.float32)   # seconds
X_IDXS = np.array([192.0 * (i / (IDX_N - 1)) ** 2 for i in range(IDX_N)], dtype=np.float32)  # metres
LEAD_T_IDXS = [0., 2., 4., 6., 8., 10.]
LEAD_T_OFFSETS = [0., 2., 4.]
META_T_IDXS = [2., 4., 6., 8., 10.]

MODEL_RUN_FREQ = 20
DT = 1 / MODEL_RUN_FREQ   # s between two frames the models run on
MODEL_CONTEXT_FREQ = 5
FRAME_SKIP = MODEL_RUN_FREQ // MODEL_CONTEXT_FREQ   # 4: the history keeps every 4th frame
DESIRE_LEN = 8
TRAFFIC_CONVENTION_LEN = 2
IMG_QUEUE_LEN = FRAME_SKIP + 1                      # 5 packed frames per camera: newest and 4 earlier

# model inputs: road/wide (packed YUV420 6x128x256 from a 512x256 warp) and the driver (Y plane 1440x960)
IMG_CHANNELS = 6                                    # Y[0::2,0::2], Y[1::2,0::2], Y[0::2,1::2], Y[1::2,1::2], U, V
IMG_INPUT_SHAPE = (1, 2 * IMG_CHANNELS, MODEL_HEIGHT // 2, MODEL_WIDTH // 2)   # (1, 12, 128, 256) uint8: older, newest
DM_INPUT_SHAPE = (1, DM_WIDTH * DM_HEIGHT)
# openpilot's monitoring reads the driver model's face position through this pinhole (the road camera's, whatever the
# driver camera), to turn the face's device-frame orientation into the driver's view of the road
DM_FACE_EFL, DM_FACE_W, DM_FACE_H = 598., 1928, 1208
