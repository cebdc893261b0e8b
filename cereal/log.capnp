@0xac0f891101669c82;
# The messages of the model daemons and the services they read. Our own schema and ordinals, with
# openpilot's field names and meanings, so `modelV2.laneLines[1].y` is what an openpilot user expects.
# Units: metres, seconds, radians, m/s unless a name says otherwise. Times are monotonic nanoseconds.

struct Event {
  logMonoTime @0 :UInt64;   # when the message was made, CLOCK_MONOTONIC ns
  valid @1 :Bool = true;    # false: the producer knows the content is not to be trusted

  union {
    modelV2 @2 :ModelDataV2;
    drivingModelData @3 :DrivingModelData;
    cameraOdometry @4 :CameraOdometry;
    driverStateV2 @5 :DriverStateV2;
    driverMonitoringState @6 :DriverMonitoringState;
    roadCameraState @7 :FrameData;
    wideRoadCameraState @8 :FrameData;
    driverCameraState @9 :FrameData;
    liveCalibration @10 :LiveCalibrationData;
    carState @11 :CarState;
    carControl @12 :CarControl;
    deviceState @13 :DeviceState;
    liveDelay @14 :LiveDelayData;
  }
}

enum ImageSensor {
  unknown @0;
  ar0231 @1;
  ox03c10 @2;
  os04c10 @3;
}

struct FrameData {
  frameId @0 :UInt32;
  timestampSof @1 :UInt64;     # start of frame, monotonic ns
  timestampEof @2 :UInt64;     # end of frame, monotonic ns
  sensor @3 :ImageSensor;
  width @4 :UInt32;
  height @5 :UInt32;
  processingTime @6 :Float32;  # s from end of frame to publish
  gain @7 :Float32;
  exposureValPercent @8 :Float32;
}

struct XYZTData {
  x @0 :List(Float32);
  y @1 :List(Float32);
  z @2 :List(Float32);
  t @3 :List(Float32);
  xStd @4 :List(Float32);
  yStd @5 :List(Float32);
  zStd @6 :List(Float32);
}

struct ModelDataV2 {
  frameId @0 :UInt32;
  frameIdExtra @1 :UInt32;       # frame id of the wide (extra) camera used
  frameAge @2 :UInt32;           # frames between the frame modelled and the newest one seen
  frameDropPerc @3 :Float32;
  timestampEof @4 :UInt64;
  modelExecutionTime @5 :Float32;  # s, wall time of warp + model + copy-out
  gpuExecutionTime @6 :Float32;
  rawPredictions @7 :Data;       # the flat float32 output vector(s), when enabled

  # plan, on T_IDXS (t holds the times)
  position @8 :XYZTData;
  orientation @9 :XYZTData;
  velocity @10 :XYZTData;
  orientationRate @11 :XYZTData;
  acceleration @12 :XYZTData;

  # lane lines and road edges, on X_IDXS (x holds the distances); order: left far, left, right, right far
  laneLines @13 :List(XYZTData);
  laneLineProbs @14 :List(Float32);
  laneLineStds @15 :List(Float32);
  roadEdges @16 :List(XYZTData);
  roadEdgeStds @17 :List(Float32);

  leadsV3 @18 :List(LeadDataV3);   # at LEAD_T_OFFSETS 0, 2, 4 s

  meta @19 :MetaData;
  confidence @20 :ConfidenceClass;
  temporalPose @21 :Pose;
  action @22 :Action;

  struct LeadDataV3 {
    prob @0 :Float32;
    probTime @1 :Float32;
    t @2 :List(Float32);
    x @3 :List(Float32);
    xStd @4 :List(Float32);
    y @5 :List(Float32);
    yStd @6 :List(Float32);
    v @7 :List(Float32);
    vStd @8 :List(Float32);
    a @9 :List(Float32);
    aStd @10 :List(Float32);
  }

  struct MetaData {
    engagedProb @0 :Float32;
    desirePrediction @1 :List(Float32);   # DESIRE_PRED_LEN x DESIRE_LEN, flattened
    desireState @2 :List(Float32);
    disengagePredictions @3 :DisengagePredictions;
    hardBrakePredicted @4 :Bool;
    laneChangeState @5 :LaneChangeState;
    laneChangeDirection @6 :LaneChangeDirection;
  }

  struct DisengagePredictions {
    t @0 :List(Float32);
    brakeDisengageProbs @1 :List(Float32);
    gasDisengageProbs @2 :List(Float32);
    steerOverrideProbs @3 :List(Float32);
    brake3MetersPerSecondSquaredProbs @4 :List(Float32);
    brake4MetersPerSecondSquaredProbs @5 :List(Float32);
    brake5MetersPerSecondSquaredProbs @6 :List(Float32);
    gasPressProbs @7 :List(Float32);
    brakePressProbs @8 :List(Float32);
  }

  enum ConfidenceClass {
    red @0;
    yellow @1;
    green @2;
  }

  struct Pose {
    trans @0 :List(Float32);
    rot @1 :List(Float32);
    transStd @2 :List(Float32);
    rotStd @3 :List(Float32);
  }

  struct Action {
    desiredCurvature @0 :Float32;     # 1/m
    desiredAcceleration @1 :Float32;  # m/s^2
    shouldStop @2 :Bool;
  }
}

enum LaneChangeState {
  off @0;
  preLaneChange @1;
  laneChangeStarting @2;
  laneChangeFinishing @3;
}

enum LaneChangeDirection {
  none @0;
  left @1;
  right @2;
}

struct DrivingModelData {
  frameId @0 :UInt32;
  frameIdExtra @1 :UInt32;
  frameDropPerc @2 :Float32;
  modelExecutionTime @3 :Float32;
  action @4 :ModelDataV2.Action;
  path @5 :PolyPath;
  laneLineMeta @6 :LaneLineMeta;
  meta @7 :MetaData;

  struct PolyPath {   # polynomial coefficients over T_IDXS, highest power first
    xCoefficients @0 :List(Float32);
    yCoefficients @1 :List(Float32);
    zCoefficients @2 :List(Float32);
  }

  struct LaneLineMeta {
    leftY @0 :Float32;     # lateral position of the ego lane's lines at x = 0
    rightY @1 :Float32;
    leftProb @2 :Float32;
    rightProb @3 :Float32;
  }

  struct MetaData {
    laneChangeState @0 :LaneChangeState;
    laneChangeDirection @1 :LaneChangeDirection;
  }
}

struct CameraOdometry {
  frameId @0 :UInt32;
  timestampEof @1 :UInt64;
  trans @2 :List(Float32);       # m/s, device frame
  rot @3 :List(Float32);         # rad/s, device frame
  transStd @4 :List(Float32);
  rotStd @5 :List(Float32);
  wideFromDeviceEuler @6 :List(Float32);
  wideFromDeviceEulerStd @7 :List(Float32);
  roadTransformTrans @8 :List(Float32);
  roadTransformTransStd @9 :List(Float32);
}

struct DriverStateV2 {
  frameId @0 :UInt32;
  modelExecutionTime @1 :Float32;
  gpuExecutionTime @2 :Float32;
  rawPredictions @3 :Data;
  wheelOnRightProb @4 :Float32;
  leftDriverData @5 :DriverData;    # as if the driver sat on the left (LHD)
  rightDriverData @6 :DriverData;   # as if the driver sat on the right (RHD)

  struct DriverData {
    faceOrientation @0 :List(Float32);     # pitch, yaw, roll (rad)
    faceOrientationStd @1 :List(Float32);
    facePosition @2 :List(Float32);        # x, y: offset from the image centre, fraction of the model frame
    facePositionStd @3 :List(Float32);
    faceProb @4 :Float32;
    leftEyeProb @5 :Float32;
    rightEyeProb @6 :Float32;
    leftBlinkProb @7 :Float32;
    rightBlinkProb @8 :Float32;
    sunglassesProb @9 :Float32;
    phoneProb @10 :Float32;
    sleepProb @11 :Float32;               # the model's sleep output (openpilot does not publish it)
  }
}

struct DriverMonitoringState {
  faceDetected @0 :Bool;
  isDistracted @1 :Bool;
  distractedType @2 :UInt32;     # bit mask: 1 pose, 2 eyes (blink/closed), 4 phone
  awarenessStatus @3 :Float32;   # 1 attentive .. 0 alert; decays while distracted, recovers when attentive
  isRHD @4 :Bool;
  rhdChecked @5 :Bool;           # enough frames seen to decide isRHD
  isActiveMode @6 :Bool;
  isLowStd @7 :Bool;
  posePitchOffset @8 :Float32;
  posePitchValidCount @9 :UInt32;
  poseYawOffset @10 :Float32;
  poseYawValidCount @11 :UInt32;
  stepChange @12 :Float32;
  hiStdCount @13 :UInt32;
  uncertainCount @14 :UInt32;
  frameId @15 :UInt32;
}

struct LiveCalibrationData {
  calStatus @0 :Status;
  calPerc @1 :Int8;
  rpyCalib @2 :List(Float32);        # device_from_calib roll, pitch, yaw (rad)
  rpyCalibSpread @3 :List(Float32);
  validBlocks @4 :Int32;
  wideFromDeviceEuler @5 :List(Float32);
  height @6 :List(Float32);          # camera height above the road (m)

  enum Status {
    uncalibrated @0;
    calibrated @1;
    invalid @2;
    recalibrating @3;
  }
}

struct CarState {
  vEgo @0 :Float32;
  aEgo @1 :Float32;
  vEgoRaw @2 :Float32;
  yawRate @3 :Float32;
  standstill @4 :Bool;
  steeringAngleDeg @5 :Float32;
  steeringPressed @6 :Bool;
  gasPressed @7 :Bool;
  brakePressed @8 :Bool;
  leftBlinker @9 :Bool;
  rightBlinker @10 :Bool;
  cruiseEnabled @11 :Bool;
  steeringTorque @12 :Float32;    # driver torque on the wheel, > 0 turns left (lane-change nudge)
  leftBlindspot @13 :Bool;
  rightBlindspot @14 :Bool;
}

struct CarControl {
  enabled @0 :Bool;
  latActive @1 :Bool;
  longActive @2 :Bool;
  actuators @3 :Actuators;
  orientationNED @4 :List(Float32);
  angularVelocity @5 :List(Float32);

  struct Actuators {
    accel @0 :Float32;
    curvature @1 :Float32;
    steeringAngleDeg @2 :Float32;
  }
}

struct DeviceState {
  started @0 :Bool;
  cpuUsagePercent @1 :List(Int8);
  memoryUsagePercent @2 :Int8;
  cpuTempC @3 :List(Float32);
  thermalStatus @4 :ThermalStatus;
  freeSpacePercent @5 :Float32;

  enum ThermalStatus {
    green @0;
    yellow @1;
    red @2;
    danger @3;
  }
}

struct LiveDelayData {
  lateralDelay @0 :Float32;          # s, steering actuation delay used for the action time
  validBlocks @1 :Int32;
  status @2 :Status;
  lateralDelayEstimate @3 :Float32;

  enum Status {
    unestimated @0;
    estimated @1;
    invalid @2;
  }
}
