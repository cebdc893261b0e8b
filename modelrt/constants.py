"""openpilot's road and driver-monitoring model I/O contract (shapes, time/distance grids, output layout).

Everything that produces or consumes model tensors (warps, the reference models, the parsers) reads these
numbers from here, so a layout change happens in one place.
"""
import numpy as np

IDX_N = 33
T_IDXS = np.array([10.0 * (i / (IDX_N - 1)) ** 2 for i in range(IDX_N)], dtype=np.float32)   # seconds
X_IDXS = np.array([192.0 * (i / (IDX_N - 1)) ** 2 for i in range(IDX_N)], dtype=np.float32)  # metres
LEAD_T_IDXS = [0., 2., 4., 6., 8., 10.]
LEAD_T_OFFSETS = [0., 2., 4.]
META_T_IDXS = [2., 4., 6., 8., 10.]

MODEL_RUN_FREQ = 20
MODEL_CONTEXT_FREQ = 5
FRAME_SKIP = MODEL_RUN_FREQ // MODEL_CONTEXT_FREQ   # 4: the history keeps every 4th frame
HISTORY_LEN = 25
FEATURE_LEN = 512
DESIRE_LEN = 8
TRAFFIC_CONVENTION_LEN = 2
FEATURE_QUEUE_LEN = (HISTORY_LEN - 1) * FRAME_SKIP + 1   # 97 hidden states, every 4th goes to the policy
DESIRE_QUEUE_LEN = HISTORY_LEN * FRAME_SKIP              # 100 desire pulses, max over each block of 4
IMG_QUEUE_LEN = FRAME_SKIP + 1                           # 5 packed frames per camera: newest and 4 earlier

PLAN_WIDTH = 15
PLAN_MHP_N = 5
PLAN_MHP_SELECTION = 1
LEAD_MHP_N = 2
LEAD_MHP_SELECTION = 3
LEAD_TRAJ_LEN = 6
LEAD_WIDTH = 4
NUM_LANE_LINES = 4
NUM_ROAD_EDGES = 2
LANE_LINES_WIDTH = 2
POSE_WIDTH = 6
DESIRE_PRED_LEN = 4

# plan columns
PLAN_POSITION, PLAN_VELOCITY, PLAN_ACCELERATION = slice(0, 3), slice(3, 6), slice(6, 9)
PLAN_T_FROM_CURRENT_EULER, PLAN_ORIENTATION_RATE = slice(9, 12), slice(12, 15)

# model frames: road/wide (packed YUV420 6x128x256 from a 512x256 warp) and the driver (Y plane 1440x960)
MODEL_WIDTH, MODEL_HEIGHT = 512, 256
IMG_CHANNELS = 6                                         # Y[0::2,0::2], Y[1::2,0::2], Y[0::2,1::2], Y[1::2,1::2], U, V
IMG_INPUT_SHAPE = (1, 2 * IMG_CHANNELS, MODEL_HEIGHT // 2, MODEL_WIDTH // 2)   # (1, 12, 128, 256) uint8
DM_WIDTH, DM_HEIGHT = 1440, 960
DM_INPUT_SHAPE = (1, DM_WIDTH * DM_HEIGHT)

# meta: engaged, then disengage-type predictions over META_T_IDXS (sigmoid), in this order
META_DISENGAGE_TYPES = ('gasDisengageProbs', 'brakeDisengageProbs', 'steerOverrideProbs', 'brake3MetersPerSecondSquaredProbs',
                        'brake4MetersPerSecondSquaredProbs', 'brake5MetersPerSecondSquaredProbs', 'gasPressProbs', 'brakePressProbs')
META_LEN = 1 + len(META_DISENGAGE_TYPES) * len(META_T_IDXS)

# Output vector sizes in openpilot's layout. An MDN head holds means then log-stds (x2); a multi-hypothesis head
# holds per hypothesis means, log-stds and selection logits.
VISION_OUTPUT_SIZES = {
  'pose': 2 * POSE_WIDTH,
  'wide_from_device_euler': 2 * 3,
  'road_transform': 2 * POSE_WIDTH,
  'desire_pred': DESIRE_PRED_LEN * DESIRE_LEN,
  'meta': META_LEN,
  'lane_lines': 2 * NUM_LANE_LINES * IDX_N * LANE_LINES_WIDTH,
  'lane_lines_prob': 2 * NUM_LANE_LINES,
  'road_edges': 2 * NUM_ROAD_EDGES * IDX_N * LANE_LINES_WIDTH,
  'lead': LEAD_MHP_N * (2 * LEAD_TRAJ_LEN * LEAD_WIDTH + LEAD_MHP_SELECTION),
  'lead_prob': LEAD_MHP_SELECTION,
  'hidden_state': FEATURE_LEN,
}
POLICY_OUTPUT_SIZES = {
  'plan': PLAN_MHP_N * (2 * IDX_N * PLAN_WIDTH + PLAN_MHP_SELECTION),
  'desire_state': DESIRE_LEN,
}
# driver monitoring, per driver side (_lhd, _rhd), then wheel_on_right
DM_FACE_DESCS_LEN = 12   # 6 means (orientation 0:3, position 3:5, size 5) + 6 log-stds
DM_SIDE_PROBS = ('face_prob', 'left_eye_prob', 'right_eye_prob', 'left_blink_prob', 'right_blink_prob',
                 'sunglasses_prob', 'using_phone_prob', 'sleep_prob')
DM_OUTPUT_SIZES = {**{f'face_descs_{s}': DM_FACE_DESCS_LEN for s in ('lhd', 'rhd')},
                   **{f'{p}_{s}': 1 for s in ('lhd', 'rhd') for p in DM_SIDE_PROBS}, 'wheel_on_right': 1}

VISION_INPUTS = {'img': (IMG_INPUT_SHAPE, 'uint8'), 'big_img': (IMG_INPUT_SHAPE, 'uint8')}
POLICY_INPUTS = {'features_buffer': ((1, HISTORY_LEN, FEATURE_LEN), 'float32'),
                 'desire_pulse': ((1, HISTORY_LEN, DESIRE_LEN), 'float32'),
                 'traffic_convention': ((1, TRAFFIC_CONVENTION_LEN), 'float32')}
DM_INPUTS = {'input_img': (DM_INPUT_SHAPE, 'uint8'), 'calib': ((1, 3), 'float32')}

def slices_from_sizes(sizes: dict[str, int]) -> dict[str, slice]:
  """Consecutive slices of one flat output vector, in the dict's order."""
  out, start = {}, 0
  for name, n in sizes.items(): out[name], start = slice(start, start + n), start + n
  return out
